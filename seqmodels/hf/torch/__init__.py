"""Pure PyTorch (+ transformers) twins of the seqmodels architectures, copied into each ``model_type: seqmodels``
export, one file per architecture as in ``seqmodels/mixers/`` and ``seqmodels/models/``:

    configuration_seqmodels.py, modeling_seqmodels.py   the auto_map entry files (config, model classes)
    lm.py, looped.py, ahn.py                            the assemblies (decoder LM, looped model, AHN layers)
    mixers.py                                           the twins by mixer name (``MIXERS``)
    attention.py, atlas.py, atlas_hybrids.py, deltanet.py, mamba2.py, longhorn.py, muonssm.py
    layers.py, recurrences.py, newton_schulz.py          what several of them share

These files import torch, transformers, the standard library and each other (relative imports) only,
never seqmodels or JAX: ``transformers``' remote-code loader copies ``modeling_seqmodels.py`` and the
files it imports from an exported directory and runs them. Constants the twins share with the JAX code
are not copied by hand: they live in plain-Python modules of the JAX side (``SHARED_FILES``) that the
writer copies beside these files, and that this package loads under the same names when it is
imported from the repository.
"""

import importlib.util
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).parent
_ROOT = PACKAGE_DIR.parents[2]
EXPORTED_FILES = tuple(sorted(path.name for path in PACKAGE_DIR.glob("*.py") if path.name != "__init__.py"))
# name in the export -> the plain-Python module (no imports beyond the standard library) it is a copy of
SHARED_FILES = {"newton_schulz_coefficients.py": _ROOT / "pallas_kernels" / "newton_schulz" / "coefficients.py",
                "atlas_memory_constants.py": _ROOT / "pallas_kernels" / "atlas_memory" / "constants.py",
                "special_tokens.py": _ROOT / "seqmodels" / "special_tokens.py"}


def exported_files() -> dict[str, Path]:
    """Every file an export holds beside its weights and configs: name -> the file it is copied from."""
    return {**{name: PACKAGE_DIR / name for name in EXPORTED_FILES}, **SHARED_FILES}


def _load_shared_modules() -> None:
    """Make ``from .newton_schulz_coefficients import ...`` (etc.) work here as it does in an export."""
    for name, source in SHARED_FILES.items():
        module_name = f"{__name__}.{name[:-len('.py')]}"
        if module_name not in sys.modules:
            spec = importlib.util.spec_from_file_location(module_name, source)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)


_load_shared_modules()
