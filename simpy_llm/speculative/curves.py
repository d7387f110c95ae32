"""Acceptance curves by name or file: the one place that finds a drafter-verifier pair's model.

A shipped curve by name (``profiles/acceptance/*.yaml``), a YAML curve file
(:mod:`simpy_llm.speculative.acceptance`) or a ``.joblib`` regressor bundle
(:mod:`simpy_llm.speculative.regressor`), each read once per content.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from simpy_llm.config.errors import ScenarioError
from simpy_llm.speculative.acceptance import AcceptanceModel, shipped_dir
from simpy_llm.speculative.curve_files import load_acceptance
from simpy_llm.speculative.regressor import AcceptanceRegressor, load_acceptance_regressor

__all__ = ["acceptance_model", "shipped_acceptance"]

_WHAT = "acceptance curve"


def shipped_acceptance() -> tuple[str, ...]:
    """Names of the shipped curves (``profiles/acceptance/*.yaml``), sorted.

    >>> shipped_acceptance()
    ('illustrative-eagle-tails', 'illustrative-laptop', 'illustrative-mobile', 't5-small_t5-xxl_ende')
    """
    return tuple(sorted(p.stem for p in shipped_dir().glob("*.yaml")))


@functools.cache
def _shipped(name: str) -> AcceptanceModel | AcceptanceRegressor:
    return load_acceptance(shipped_dir() / f"{name}.yaml")


def acceptance_model(name_or_path: str | os.PathLike[str]) -> AcceptanceModel | AcceptanceRegressor:
    """A shipped curve by name (:func:`shipped_acceptance`), else a curve file by path: a
    YAML curve file, or a ``.joblib`` regressor bundle
    (:mod:`simpy_llm.speculative.regressor`; the ``learn`` extra installs scikit-learn).
    A file is read once per content (cached by path, modification time and size), so
    every part of a simulation shares one model and its memo.

    Raises
    ------
    ScenarioError
        When *name_or_path* is neither a shipped name nor a readable, valid file.
    """
    name = str(name_or_path)
    if name in shipped_acceptance():
        return _shipped(name)
    path = Path(name)
    if not path.is_file():
        raise ScenarioError(
            name, [("", f"no shipped acceptance curve of that name (shipped: {', '.join(shipped_acceptance())}) "
                        "and no such file")], _WHAT,
        )
    stat = path.stat()
    return _cached_file(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _cached_file(path: str, _mtime_ns: int, _size: int) -> AcceptanceModel | AcceptanceRegressor:
    if not path.endswith(".joblib"):
        return load_acceptance(path)
    try:
        return load_acceptance_regressor(path)
    except ImportError as exc:  # scikit-learn (or joblib) is missing
        raise ScenarioError(
            path, [("", f"a regressor bundle needs scikit-learn ({exc}): pip install 'simpy-llm[learn]'")], _WHAT,
        ) from None
