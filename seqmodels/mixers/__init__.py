"""Sequence mixers, one file each; importing this package registers them all (see ``registry``)."""

from seqmodels.mixers.registry import (MIXERS, Mixer, build_mixer, check_mixer_names,  # noqa: F401
                                       mixer_flops_per_token, register)
from seqmodels.mixers import attention  # noqa: F401,E402  (registers attention, swa)
from seqmodels.mixers import atlas, atlas_hybrids  # noqa: F401,E402  (registers atlas, atlas_mag, atlas_mal)
from seqmodels.mixers import mamba2, deltanet, muonssm, longhorn  # noqa: F401,E402  (register the recurrent mixers)
