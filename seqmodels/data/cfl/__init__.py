"""The context-free-language recognition task: languages, recognisers, token rows, batches.

    languages.py    the languages; positives drawn (near) uniformly, hard negatives one edit away (sample)
    recognisers.py  the textbook membership test of each language (every label comes from it)
    rows.py         the vocabulary and the row of one labelled string: [BOS_language] w [CLS] -> label
    batches.py      the training stream and the held-out batches of data.source=cfl

``seqmodels.data.sources.cfl`` registers the source; ``seqmodels.evaluation.cfl`` scores a model on
``rows.evaluation_set``. The names below are the task's public interface.
"""

from seqmodels.data.cfl.languages import LANGUAGES, nearest_valid_length, sample, valid_lengths
from seqmodels.data.cfl.recognisers import RECOGNISERS
from seqmodels.data.cfl.rows import VOCAB_SIZE, decode, encode, evaluation_set, labelled_batch

__all__ = ["LANGUAGES", "RECOGNISERS", "VOCAB_SIZE", "decode", "encode", "evaluation_set", "labelled_batch",
           "nearest_valid_length", "sample", "valid_lengths"]
