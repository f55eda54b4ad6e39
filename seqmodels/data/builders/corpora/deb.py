"""Debian packages: fetching them with ``apt-get download`` and reading their files without dpkg.

A ``.deb`` is an ``ar`` archive of ``debian-binary``, ``control.tar.*`` and ``data.tar.*``
(xz, gzip, bzip2 or uncompressed; Python's ``tarfile`` reads these, zstd it cannot before 3.14).
``deb_files`` yields ``(path, bytes)`` for the regular files of the data archive that a predicate
accepts, so nothing is installed or extracted to disk; ``deb_control`` reads the control fields
(``Package``, ``Version``).

``download`` runs ``apt-get download`` in a directory. When apt has no package lists (a fresh
container) it runs ``apt-get update`` first: as root into the system's lists, otherwise into a
user-writable state and cache directory next to the downloads, passed to both commands with
``-o Dir::State::Lists=... -o Dir::Cache=...``. Failures raise ``AptError`` with apt's own message
and what to do.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterator, Sequence

_AR_MAGIC = b"!<arch>\n"
_AR_HEADER = 60


class AptError(RuntimeError):
    """apt could not find or fetch a package; the message says what apt said and what to do."""


def ar_members(data: bytes, origin: str) -> dict[str, bytes]:
    """The members of an ``ar`` archive (a ``.deb``), by name."""
    if not data.startswith(_AR_MAGIC):
        raise ValueError(f"{origin}: not a Debian package (no ar archive header)")
    members, position = {}, len(_AR_MAGIC)
    while position + _AR_HEADER <= len(data):
        header = data[position:position + _AR_HEADER]
        name = header[:16].decode("ascii", errors="replace").strip().rstrip("/")
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError:
            raise ValueError(f"{origin}: corrupt ar member header at byte {position}") from None
        start = position + _AR_HEADER
        members[name] = data[start:start + size]
        position = start + size + (size % 2)  # members are 2-byte aligned
    return members


def _member_tar(members: dict[str, bytes], stem: str, origin: str) -> tarfile.TarFile:
    for name, payload in members.items():
        if name == stem or name.startswith(stem + "."):
            if name.endswith(".zst"):
                raise ValueError(f"{origin}: {name} is zstd-compressed, which Python's tarfile cannot read "
                                 "before Python 3.14")
            return tarfile.open(fileobj=io.BytesIO(payload), mode="r:*")
    raise ValueError(f"{origin}: no {stem}.* member (members: {', '.join(members)})")


def deb_control(path: str) -> dict[str, str]:
    """The control fields of the package at ``path`` (``Package``, ``Version``, ...)."""
    with open(path, "rb") as handle:
        members = ar_members(handle.read(), path)
    with _member_tar(members, "control.tar", path) as archive:
        for member in archive.getmembers():
            if os.path.normpath(member.name) == "control":
                text = archive.extractfile(member).read().decode("utf-8", errors="replace")
                break
        else:
            raise ValueError(f"{path}: control.tar has no control file")
    fields = {}
    for line in text.splitlines():
        match = re.match(r"^([\w-]+):\s*(.*)$", line)
        if match:
            fields[match.group(1)] = match.group(2)
    return fields


def deb_files(path: str, accept: Callable[[str], bool]) -> Iterator[tuple[str, bytes]]:
    """``(path inside the package, contents)`` of each regular file that ``accept(path)`` admits, sorted by path."""
    with open(path, "rb") as handle:
        members = ar_members(handle.read(), path)
    with _member_tar(members, "data.tar", path) as archive:
        files = sorted((os.path.normpath(m.name).lstrip("./"), m) for m in archive.getmembers() if m.isfile())
        for name, member in files:
            if accept(name):
                yield name, archive.extractfile(member).read()


def _apt_options(state_dir: str | None) -> list[str]:
    if state_dir is None:
        return []
    lists, cache = os.path.join(state_dir, "lists"), os.path.join(state_dir, "cache")
    os.makedirs(os.path.join(lists, "partial"), exist_ok=True)
    os.makedirs(os.path.join(cache, "archives", "partial"), exist_ok=True)
    return ["-o", f"Dir::State::Lists={lists}", "-o", f"Dir::Cache={cache}"]


def _run(command: Sequence[str], cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(command), cwd=cwd, capture_output=True, text=True, check=False)


def _system_lists_empty() -> bool:
    lists = "/var/lib/apt/lists"
    return not os.path.isdir(lists) or not any(name.endswith(("Packages", "Packages.lz4", "Packages.gz",
                                                              "Packages.xz")) for name in os.listdir(lists))


def _update(state_dir: str | None) -> None:
    result = _run(["apt-get", *_apt_options(state_dir), "update"])
    if result.returncode != 0:
        raise AptError(f"`apt-get update` failed (exit {result.returncode}): {result.stderr.strip()[-800:]}\n"
                       "Check that a Debian mirror is reachable (/etc/apt/sources.list*), or run "
                       "`sudo apt-get update` and retry.")


def resolve_newest(pattern: str, state_dir: str | None = None) -> str:
    """The name of the highest-versioned package whose name matches the POSIX regex ``pattern`` (``apt-cache search``; no ``\\d``)."""
    result = _run(["apt-cache", *_apt_options(state_dir), "search", "--names-only", pattern])
    names = sorted({line.split(" - ")[0].strip() for line in result.stdout.splitlines()
                    if re.fullmatch(pattern, line.split(" - ")[0].strip())})
    if result.returncode != 0 or not names:
        raise AptError(f"no package matches {pattern!r} in apt's lists ({result.stderr.strip()[-300:]}); "
                       "this corpus needs a Debian (or derived) system whose mirror carries it")

    def version_key(name: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", name))

    return max(names, key=version_key)


def download(packages: Sequence[str], directory: str) -> dict[str, str]:
    """Fetch ``packages`` into ``directory`` with ``apt-get download``; return {package: path of its .deb}.

    A ``.deb`` already in ``directory`` is reused. Raises ``AptError`` when apt is missing or fails.
    """
    if not packages:
        raise ValueError("download: no packages named")
    if shutil.which("apt-get") is None:
        raise AptError("apt-get is not on PATH: this corpus is built from Debian packages and needs a Debian "
                       "(or derived) system; copy the .deb files into --debs on another machine instead")
    os.makedirs(directory, exist_ok=True)
    state_dir = None if os.geteuid() == 0 else os.path.join(directory, ".apt")
    if state_dir is not None and os.path.isdir(os.path.join(state_dir, "lists")) is False and _system_lists_empty():
        _update(state_dir)
    elif state_dir is None and _system_lists_empty():
        _update(None)
    missing = [p for p in packages if not _find_deb(directory, p)]
    if missing:
        result = _run(["apt-get", *_apt_options(state_dir), "download", *missing], cwd=directory)
        if result.returncode != 0 and "Unable to locate" in result.stderr and state_dir is None:
            _update(None)
            result = _run(["apt-get", "download", *missing], cwd=directory)
        if result.returncode != 0:
            raise AptError(f"`apt-get download {' '.join(missing)}` failed (exit {result.returncode}): "
                           f"{result.stderr.strip()[-800:]}")
    found = {p: _find_deb(directory, p) for p in packages}
    absent = [p for p, path in found.items() if path is None]
    if absent:
        raise AptError(f"apt-get download succeeded but left no .deb for {', '.join(absent)} in {directory}")
    return found


def _find_deb(directory: str, package: str) -> str | None:
    """The newest-named ``<package>_*.deb`` in ``directory``, or None."""
    if not os.path.isdir(directory):
        return None
    names = sorted(n for n in os.listdir(directory) if n.startswith(package + "_") and n.endswith(".deb"))
    return os.path.join(directory, names[-1]) if names else None
