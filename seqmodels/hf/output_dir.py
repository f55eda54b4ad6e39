"""Writing a new directory all at once: staged beside the target, renamed into place, removed on failure.

Replacing an existing directory (``--force``) is refused when the directory is, or holds, something a
user cannot get back from the export: a run directory (its ``config.yaml``), a checkpoint (an orbax
``_CHECKPOINT_METADATA`` or a ``checkpoints/`` folder), this repository or the directory above it, the
working directory or the home directory. An export being replaced holds none of these.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from seqmodels.errors import HFFormatError

REPOSITORY = Path(__file__).resolve().parents[2]
# Names whose presence under a directory makes it irreplaceable: a run's resolved config, a checkpoint.
PROTECTED_NAMES = {"config.yaml": "a run directory", "_CHECKPOINT_METADATA": "a checkpoint",
                   "checkpoints": "a checkpoints folder", "run.lock": "a run directory"}


def _within(path: Path, ancestor: Path) -> bool:
    return path == ancestor or ancestor in path.parents


def protected_content(directory: Path) -> str | None:
    """What makes ``directory`` (resolved, existing) irreplaceable, in words; None when nothing does."""
    places = {REPOSITORY: "this repository", REPOSITORY.parent: "the directory above this repository",
              Path.cwd().resolve(): "the working directory", Path.home().resolve(): "the home directory"}
    for place, name in places.items():
        if _within(place, directory):
            return name if place == directory else f"it contains {name} ({place})"
    for root, folders, files in os.walk(directory):
        for name in (*files, *folders):
            if name in PROTECTED_NAMES:
                found = Path(root) / name
                return f"it holds {PROTECTED_NAMES[name]} ({found})"
    return None


def check_new_directory(out_dir: Path, flag: str = "--out", *, force: bool = False) -> None:
    """``HFFormatError`` unless ``out_dir`` is absent or an empty directory (a user's files are never replaced).

    With ``force`` an existing directory may be replaced (never a file), unless ``protected_content``
    finds a run, a checkpoint, the repository or the working directory in it.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise HFFormatError(f"{out_dir}: already exists and is not a directory; choose a new {flag}")
    if not out_dir.exists() or not any(out_dir.iterdir()):
        return
    if not force:
        raise HFFormatError(f"{out_dir}: already exists and is not an empty directory; choose a new {flag} "
                            "(or pass --force to replace it)")
    protected = protected_content(out_dir.resolve())
    if protected is not None:
        raise HFFormatError(f"{out_dir}: --force refuses to replace it: {protected}; --force only replaces an "
                            f"earlier export. Choose a new {flag}")


def write_new_directory(out_dir: Path, write: Callable[[Path], None], *, force: bool = False) -> Path:
    """Call ``write(staging)`` on a temporary directory beside ``out_dir``, then rename it to ``out_dir``.

    With ``force`` an existing ``out_dir`` is replaced, and only once ``write`` has completed: it is
    moved aside, the staging directory renamed in, then the old one deleted. The staging directory is
    removed whatever happens; when the rename fails the old directory is put back.
    """
    check_new_directory(out_dir, force=force)
    out_dir = Path(out_dir).resolve()  # '.', '..' and symlinks: the staging goes beside the real target
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    previous, installed = None, False
    try:
        write(staging)
        staging.chmod(0o755)
        if out_dir.exists():
            previous = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old.", dir=out_dir.parent))
            out_dir.rename(previous / "replaced")
        try:
            staging.rename(out_dir)
            installed = True
        except BaseException:
            if previous is not None and (previous / "replaced").exists() and not out_dir.exists():
                (previous / "replaced").rename(out_dir)
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if previous is not None and (installed or not (previous / "replaced").exists()):
            shutil.rmtree(previous, ignore_errors=True)  # (a replaced directory that could not be put back stays)
    return out_dir
