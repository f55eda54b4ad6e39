"""Builders: commands that write what training later reads; none is imported by the data pipeline.

    python -m seqmodels.data.builders.corpora debdocs --out DIR       a text corpus from Debian packages (corpora/)
    python -m seqmodels.data.builders.tokenizer train --input IN ...  a byte-level BPE tokenizer (tokenizer.py)
    python -m seqmodels.data.builders.prepare --input GLOB ...        ArrayRecord shards of text or token ids
                                                                      (prepare.py, token_shards.py)

``files.py`` resolves an ``--input`` and hashes what was read; ``seqmodels.data.shards`` names the
shard files that ``prepare`` writes and the sources read.
"""
