"""Data: tokenizers, document sources, packing, and the grain training / evaluation pipelines."""

from seqmodels.data.corpus import DataError, DocumentSplit, load_documents
from seqmodels.data.packing import FIELDS, PackedRowsIterDataset, pack_and_batch, pack_examples, pad_batch
from seqmodels.data.pipeline import describe_source, make_eval_batches, make_train_dataset
from seqmodels.data.tokenizers import BOS_ID, EOS_ID, ByteTokenizer, get_tokenizer

__all__ = [
    "BOS_ID", "EOS_ID", "FIELDS", "ByteTokenizer", "DataError", "DocumentSplit", "PackedRowsIterDataset",
    "describe_source", "get_tokenizer", "load_documents", "make_eval_batches", "make_train_dataset",
    "pack_and_batch", "pack_examples", "pad_batch",
]
