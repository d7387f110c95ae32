"""Where the shipped profiles live: model configurations, GPU facts, BLIS and Vidur profiles,
LUTs, device profiles and acceptance curves (the source tree's ``profiles/``, packaged into the
wheel as ``simpy_llm/_profiles``).

It sits below every module that reads those files (:mod:`~simpy_llm.serving.hardware`, the
latency models), so that none of them has to import another to find the folder.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["profiles_dir", "profiles_path"]


def profiles_dir() -> Path:
    """The folder of shipped profiles (inside the wheel, or the source tree's ``profiles/``).

    Examples
    --------
    >>> (profiles_dir() / "gpus.yaml").is_file()
    True
    """
    here = Path(__file__).resolve().parent.parent
    packaged = here / "_profiles"
    return packaged if packaged.is_dir() else here.parent / "profiles"


def profiles_path() -> Path:
    """The folder of shipped device profiles, ``profiles_dir() / "devices"`` (here, not in
    :mod:`~simpy_llm.serving.devices`, so that a run's manifest finds it without the catalogue)."""

    return profiles_dir() / "devices"
