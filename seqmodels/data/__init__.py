"""Data: tokenizers, document corpora, packing, the data-source registry and the grain pipelines.

Importing this package registers every data source (``sources.py``): each module below registers
the sources it defines.
"""

from seqmodels.data import cfl_pipeline, records, synthetic, text, token_shards  # noqa: F401  (each registers its sources)
from seqmodels.data.corpus import DataError, DocumentSplit, load_documents
from seqmodels.data.packing import FIELDS, PackedRowsIterDataset, pack_and_batch, pack_examples, pad_batch
from seqmodels.data.pipeline import describe_source, make_eval_batches, make_train_dataset, required_vocab_size
from seqmodels.data.sources import DataSource, get_source, register_source, source_names
from seqmodels.data.tokenizers import BOS_ID, EOS_ID, ByteTokenizer, get_tokenizer

__all__ = [
    "BOS_ID", "EOS_ID", "FIELDS", "ByteTokenizer", "DataError", "DataSource", "DocumentSplit",
    "PackedRowsIterDataset", "describe_source", "get_source", "get_tokenizer", "load_documents",
    "make_eval_batches", "make_train_dataset", "pack_and_batch", "pack_examples", "pad_batch",
    "register_source", "required_vocab_size", "source_names",
]
