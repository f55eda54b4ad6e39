"""Pure PyTorch (+ transformers) modules of every seqmodels architecture, copied into each export.

These files import torch, transformers and each other (relative imports) only, never seqmodels or
JAX: ``transformers``' remote-code loader copies ``configuration_seqmodels.py``,
``modeling_seqmodels.py`` and the files they import from an exported directory and runs them.
``EXPORTED_FILES`` lists them for the writer.
"""

from pathlib import Path

PACKAGE_DIR = Path(__file__).parent
EXPORTED_FILES = ("configuration_seqmodels.py", "modeling_seqmodels.py", "layers_seqmodels.py",
                  "attention_seqmodels.py", "recurrent_seqmodels.py", "newton_schulz_seqmodels.py",
                  "atlas_seqmodels.py", "ahn_seqmodels.py")
