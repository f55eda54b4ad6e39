"""The exported seqmodels architectures as ``transformers`` models (pure PyTorch twins of ``seqmodels.models``):
the ``auto_map`` entry file of every ``model_type: seqmodels`` export.

    SeqmodelsForCausalLM                        the decoder LM over any list of mixers, and AHN (``lm``)
    SeqmodelsLoopedForSequenceClassification    the looped padded transformer (``looped``)

Where the twins differ from the JAX model, and why: Gated DeltaNet, DeltaNet, Mamba2, LongHorn and MuonSSM on
those three run a chunk-parallel form for any call of more than one token (``chunked.py``) and their recurrent
form for one decoded token (equal within float32 round-off); Atlas and the AHN compressors run their recurrent
form over the prompt too (one state update per token), a chunked form for them is not written yet. Attention
scores and every recurrent state are float32 whatever the weights' dtype, and in a bfloat16 export Atlas's
Newton-Schulz also runs in float32 (JAX: ``model.compute_dtype`` operands with float32 accumulation).
"""

from __future__ import annotations

# Every other file of the export, imported here one line each: transformers before 5 copies out of a local
# directory only the files that this entry file imports itself (and then fails on what they import).
from .ahn import AHNBlock  # noqa: F401
from .atlas import Atlas  # noqa: F401
from .atlas_hybrids import AtlasMAG  # noqa: F401
from .atlas_memory_constants import NORM_EPS  # noqa: F401
from .attention import Attention  # noqa: F401
from .chunked import chunk_delta_rule  # noqa: F401
from .configuration_seqmodels import SeqmodelsConfig  # noqa: F401
from .deltanet import DeltaNet  # noqa: F401
from .kernels import set_kernels  # noqa: F401
from .layers import RMSNorm  # noqa: F401
from .lm import SeqmodelsForCausalLM
from .longhorn import LongHorn  # noqa: F401
from .looped import SeqmodelsLoopedForSequenceClassification
from .mamba2 import Mamba2  # noqa: F401
from .mixers import MIXERS  # noqa: F401
from .muonssm import MuonSSMMamba2  # noqa: F401
from .newton_schulz import newton_schulz  # noqa: F401
from .newton_schulz_coefficients import resolve_coefficients  # noqa: F401
from .recurrences import delta_rule_scan  # noqa: F401
from .special_tokens import ACCEPT_ID  # noqa: F401

__all__ = ["SeqmodelsForCausalLM", "SeqmodelsLoopedForSequenceClassification"]
