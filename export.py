"""Export a run's checkpoint as a Hugging Face model: ``python export.py --run RUN --out DIR [--step N]
[--dtype float32|bfloat16] [--format NAME] [--force]``.

A Transformer++ run (every layer ``attention``, SwiGLU MLPs, no q/k norm or convolution) becomes a
plain ``LlamaForCausalLM`` (``Qwen2ForCausalLM`` with ``model.attention.qkv_bias``) that
``transformers.AutoModelForCausalLM.from_pretrained(DIR)`` loads with no remote code; so does a Mamba2 run
in the reference layout (every layer ``mamba2``, no MLP, the gated norm over all heads), as
``Mamba2ForCausalLM``. Every other
architecture (any ``model.mixers`` list, the looped model, AHN: the frozen base's weights with the
compressors') becomes ``model_type: seqmodels`` with its own pure-PyTorch modules in the directory,
loaded with ``trust_remote_code=True`` (``AutoModelForCausalLM``; the looped model:
``AutoModelForSequenceClassification``). Either way:
``config.json``, ``model.safetensors`` (sharded with an index above 2 GB), ``generation_config.json``,
and the run's tokenizer (``AutoTokenizer.from_pretrained(DIR)``): the files of ``data.tokenizer: hf:DIR``,
or the byte-level tokenizer's own ``tokenizer.json``; a run on a generated task carries none.
``--out`` must not exist or be empty unless ``--force``, which replaces an earlier export only (never a
directory holding a run, a checkpoint, this repository or the working directory); nothing is written
when the export fails.

``--format fla`` writes a DeltaNet run (every layer ``gated_deltanet``, or every layer ``deltanet``, with MLPs)
as flash-linear-attention's ``GatedDeltaNetForCausalLM`` / ``DeltaNetForCausalLM`` (``model_type``
``gated_deltanet`` / ``delta_net``; ``import fla`` registers them with ``AutoModelForCausalLM``). fla's short
convolutions have no bias, so a run whose q/k/v convolution biases are not all zero is refused (exit 2), as
is any other architecture; ``seqmodels.hf.fla`` lists the map.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="run directory (train.run_dir of the run)")
    parser.add_argument("--out", required=True, help="directory to write (must not exist, or be empty)")
    parser.add_argument("--force", action="store_true",
                        help="replace an earlier export at --out (once the new export is complete); a directory "
                             "holding a run, a checkpoint, the repository or the working directory is refused")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="dtype of the written weights")
    parser.add_argument("--format", default=None,
                        help="checkpoint format: llama, mamba2, seqmodels or fla (default: the first of llama, "
                             "mamba2, seqmodels that takes the model)")
    return parser.parse_args(argv)


def _os_problem(error: OSError, run: str, out: str) -> str:
    """What an ``OSError`` of an export means: a file of the run that cannot be read, else the output (written in a
    staging folder beside ``out``, removed on failure) that cannot be written."""
    reason = error.strerror or str(error)
    target = Path(out).resolve()
    if error.filename is not None:
        path = Path(os.fsdecode(error.filename)).resolve()
        if path.is_relative_to(Path(run).resolve()) and not path.is_relative_to(target.parent):
            return f"cannot read {path}: {reason}; check the run directory --run"
    return (f"cannot write the export to {target}: {reason}; free space or choose another --out "
            "(nothing was left behind)")


def main(argv=None) -> int:
    from seqmodels.training.streams import quiet_when_closed
    with quiet_when_closed():  # a reader that closes stdout or stderr silences the output, never the work
        return _main(argv)


def _main(argv) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from seqmodels.compilation import use_compilation_cache
    from seqmodels.config import ConfigError
    from seqmodels.errors import HFFormatError
    from seqmodels.hf.export import export_run
    from seqmodels.runs.checkpoints import CheckpointError
    try:
        use_compilation_cache()  # SEQMODELS_COMPILATION_CACHE, else ~/.cache/seqmodels/xla
        out, step = export_run(args.run, args.out, step=args.step, dtype=args.dtype, force=args.force,
                               format_name=args.format)
    except (HFFormatError, CheckpointError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"error: {_os_problem(error, args.run, args.out)}", file=sys.stderr)
        return 2
    print(f"exported step {step} of {args.run} to {out} ({args.dtype})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
