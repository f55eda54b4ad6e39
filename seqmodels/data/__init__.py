"""Data: the data-source registry and the grain pipelines, tokenizers, packing, document corpora, builders.

    pipeline.py        make_train_dataset / make_eval_batches / required_vocab_size / describe_source
    sources/           the registry of data.source values, one module per source or family of sources
    packing.py         elements -> fixed-length rows with segment ids -> batches
    tokenizers.py      data.tokenizer: byte, hf:DIR
    document_files.py  documents stored one per file (listing a glob, reading UTF-8)
    document_split.py  a corpus's documents split train / held-out by a hash of each identity
    document_rows.py   a document corpus as packed token rows (what the document sources share)
    shards.py          the ArrayRecord shard layout that builders write and sources read
    errors.py          DataError
    cfl/               the context-free-language recognition task
    builders/          commands that write corpora, tokenizers and shards (python -m seqmodels.data.builders.*)

The registry imports every module of ``sources/`` the first time it is asked for a source, so every
source is registered before any is looked up.
"""

from seqmodels.data.document_split import DocumentSplit, load_documents
from seqmodels.data.errors import DataError
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
