"""Checks that a command can write where it was told to, made before it simulates or sends anything.

Every command with ``--out`` (``run``, ``workload``, ``observe``, ``sweep``, ``capacity``,
``calibrate``) checks its output path first, so that a path it cannot write fails at once,
not after the work is done. A directory is created (with its parents) and a file is created
in it, then both are removed again, leaving the file system as it was (a command refused
later, for another reason, leaves nothing behind): writing is the only check that tells,
whoever runs it (permission bits do not bind the superuser, and a read-only file system
refuses even them). This module imports nothing of the package.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["OutputPathError", "check_output_dir", "check_output_file"]


class OutputPathError(ValueError):
    """An output path a command cannot write: the message names the option, the path and the
    operating system's reason."""


def check_output_dir(path: str | os.PathLike[str], option: str = "--out") -> Path:
    """Make sure the directory *path* can be made, and files written in it.

    Creates it (and its parents) when missing and a file in it, then removes what it made.

    Raises
    ------
    OutputPathError
        Naming *option*, *path* and why it cannot be written (e.g. "Not a directory" when
        a part of it is a file, "Permission denied", "Read-only file system").

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     out = check_output_dir(Path(d) / "runs" / "one")
    ...     (out.name, out.exists(), list(Path(d).iterdir()))
    ('one', False, [])
    >>> with tempfile.NamedTemporaryFile() as f:
    ...     check_output_dir(f.name)
    Traceback (most recent call last):
    ...
    simpy_llm.output_paths.OutputPathError: --out /...: cannot write a directory there: it is a file
    """
    out = Path(path)
    reason = _unwritable_dir(out)
    if reason is not None:
        raise OutputPathError(f"{option} {path}: cannot write a directory there: {reason}")
    return out


def _unwritable_dir(out: Path) -> str | None:
    """Why the directory *out* cannot be made or written in (None when it can); the
    directories made to find out are removed again."""
    if out.exists() and not out.is_dir():
        return "it is a file"
    missing = [d for d in (out, *out.parents) if not d.exists()]  # deepest first
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-check-"):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        for made in missing:
            try:
                made.rmdir()
            except FileNotFoundError:  # a deeper one the failed mkdir did not get to
                continue
            except OSError:  # no longer empty (something else wrote there): leave it and its parents
                break
    return None


def check_output_file(path: str | os.PathLike[str], option: str = "--out") -> Path:
    """Make sure the file *path* can be written: it is not a directory, and its directory can
    be made and takes new files (checked as :func:`check_output_dir` does). An existing file
    is left as it is.

    Raises
    ------
    OutputPathError
        Naming *option*, *path* and why it cannot be written.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     check_output_file(Path(d) / "fits" / "profile.yaml").name
    'profile.yaml'
    >>> with tempfile.TemporaryDirectory() as d:
    ...     check_output_file(d, option="--profile")
    Traceback (most recent call last):
    ...
    simpy_llm.output_paths.OutputPathError: --profile /...: cannot write a file there: it is a directory
    """
    out = Path(path)
    if out.is_dir():
        reason: str | None = "it is a directory"
    elif out.parent.exists() and not out.parent.is_dir():
        reason = f"{out.parent} is a file, not a directory"
    else:
        reason = _unwritable_dir(out.parent)
    if reason is None and out.exists() and not os.access(out, os.W_OK):
        reason = "Permission denied"
    if reason is not None:
        raise OutputPathError(f"{option} {path}: cannot write a file there: {reason}")
    return out
