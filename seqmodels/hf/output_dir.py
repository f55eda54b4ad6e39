"""Writing a new directory all at once: staged beside the target, renamed into place, removed on failure."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from seqmodels.hf.errors import HFFormatError


def check_new_directory(out_dir: Path, flag: str = "--out") -> None:
    """``HFFormatError`` unless ``out_dir`` is absent or an empty directory (a user's files are never replaced)."""
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise HFFormatError(f"{out_dir}: already exists and is not an empty directory; choose a new {flag}")


def write_new_directory(out_dir: Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(staging)`` on a temporary directory beside ``out_dir``, then rename it to ``out_dir``."""
    check_new_directory(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        write(staging)
        if out_dir.exists():
            out_dir.rmdir()
        staging.chmod(0o755)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir
