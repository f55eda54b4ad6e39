"""Writing a new directory all at once: staged beside the target, renamed into place, removed on failure."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from seqmodels.errors import HFFormatError


def check_new_directory(out_dir: Path, flag: str = "--out", *, force: bool = False) -> None:
    """``HFFormatError`` unless ``out_dir`` is absent or an empty directory (a user's files are never replaced).

    With ``force`` an existing directory may be replaced (never a file).
    """
    if out_dir.exists() and not out_dir.is_dir():
        raise HFFormatError(f"{out_dir}: already exists and is not a directory; choose a new {flag}")
    if not force and out_dir.exists() and any(out_dir.iterdir()):
        raise HFFormatError(f"{out_dir}: already exists and is not an empty directory; choose a new {flag} "
                            "(or pass --force to replace it)")


def write_new_directory(out_dir: Path, write: Callable[[Path], None], *, force: bool = False) -> Path:
    """Call ``write(staging)`` on a temporary directory beside ``out_dir``, then rename it to ``out_dir``.

    With ``force`` an existing ``out_dir`` is replaced, and only once ``write`` has completed: it is
    moved aside, the staging directory renamed in, then the old one deleted.
    """
    check_new_directory(out_dir, force=force)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        write(staging)
        staging.chmod(0o755)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    previous = None
    if out_dir.exists():
        previous = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old.", dir=out_dir.parent))
        out_dir.rename(previous / "replaced")
    staging.rename(out_dir)
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)
    return out_dir
