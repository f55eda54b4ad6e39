"""Separate Python environments for tests that need packages this venv does not pin.

``package_environment(name, requirement, probe)`` makes (once, then reuses) a venv under
``ENVIRONMENTS`` (the repository's ``.cache/``, kept between runs) with ``pip install requirement`` on top
of this venv's packages: a ``.pth`` file adds this venv's site-packages after the new venv's own, so torch
and everything else the requirement accepts are this venv's and are not downloaded again; what the
requirement pins differently is installed in the new venv and shadows this venv's copy. ``probe`` is a
Python expression printed by the new interpreter after the install; the environment is ready only if it
prints ``expected``. A failed step fails the test with the command that failed.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]
ENVIRONMENTS = ROOT / ".cache" / "test_environments"


def run_checked(command: list[str], what: str, env: dict | None = None) -> str:
    """``command``'s stdout; a non-zero exit fails the test with the command and the ends of its output."""
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        pytest.fail(f"{what} failed (exit {result.returncode}): {' '.join(map(str, command))}\n"
                    f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}", pytrace=False)
    return result.stdout


def package_environment(name: str, requirement: str | list[str], probe: str, expected: str,
                        pip_options: tuple[str, ...] = (), build_environment: dict | None = None) -> Path:
    """The ``bin/`` of a venv with ``requirement`` (one or several) over this venv's packages (module docstring);
    ``pip_options`` and ``build_environment`` (variables added to pip's environment) go to the install."""
    requirements = [requirement] if isinstance(requirement, str) else list(requirement)
    ENVIRONMENTS.mkdir(parents=True, exist_ok=True)
    root = ENVIRONMENTS / name
    python = root / "bin" / "python"
    with open(ENVIRONMENTS / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test workers never build one environment at once
        if (root / "ready").is_file():
            return root / "bin"
        run_checked([sys.executable, "-m", "venv", "--clear", str(root)], f"creating the venv {root}")
        own = Path(run_checked([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               "asking the venv for its site-packages").strip())
        (own / "zz_base_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # after its own packages
        environment = None if build_environment is None else {**os.environ, **build_environment}
        run_checked([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
                     *pip_options, *requirements], f"installing {' '.join(requirements)}", env=environment)
        found = run_checked([str(python), "-c", f"print({probe})"], f"probing {' '.join(requirements)}").strip()
        if found != expected:
            pytest.fail(f"{root}: {probe} is {found!r} after installing {' '.join(requirements)}, not {expected!r}",
                        pytrace=False)
        (root / "ready").write_text("\n".join(requirements) + "\n")
    return root / "bin"
