"""Sequence mixers, one file each; importing this package imports every module in it, so each
registers its mixers and config sections (see ``registry``) without being listed here."""

import importlib
import pkgutil

from seqmodels.mixers.registry import (MIXERS, SECTIONS, Mixer, build_mixer, check_context_parallel,  # noqa: F401
                                       check_mixer_names, context_parallel_notes,
                                       mixer_flops_per_token, register, register_section)


def _import_every_module() -> None:
    for name in sorted(info.name for info in pkgutil.iter_modules(__path__)):
        importlib.import_module(f"{__name__}.{name}")


_import_every_module()
