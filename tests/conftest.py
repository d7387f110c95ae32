"""Shared test set-up: the Hypothesis profile and the quickstart scenario."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import settings

settings.register_profile("ci", deadline=None, derandomize=True, database=None)
settings.load_profile("ci")

QUICKSTART = Path(__file__).resolve().parent.parent / "scenarios" / "quickstart.yaml"
QUICKSTART_DATA: dict[str, Any] = yaml.safe_load(QUICKSTART.read_text())


@pytest.fixture
def quickstart_path() -> Path:
    """Path of the shipped quickstart scenario."""
    return QUICKSTART


@pytest.fixture
def quickstart_data() -> dict[str, Any]:
    """A fresh (mutable) copy of the quickstart scenario as plain data."""
    return copy.deepcopy(QUICKSTART_DATA)
