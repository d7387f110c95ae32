"""Plots are part of the base install: matplotlib is a dependency, and no plot is skipped."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import matplotlib
import pandas as pd
import pytest

from simpy_llm.explore import capacity
from simpy_llm.explore.capacity import CapacityCard, max_stable_load
from simpy_llm.workload.export import plot_histograms

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _requirement_names(requirements: list[str]) -> set[str]:
    names = set()
    for req in requirements:
        name = req.split(";")[0]
        for sep in "<>=!~[ ":
            name = name.split(sep)[0]
        names.add(name.strip().lower())
    return names


def test_matplotlib_is_a_dependency_and_the_plots_extra_still_installs() -> None:
    """pyproject lists matplotlib among the dependencies (so `workload --plots` and the capacity
    and calibration plots work on the base install), and the `plots` extra is kept for old
    install commands."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert "matplotlib" in _requirement_names(project["dependencies"])
    assert _requirement_names(project["optional-dependencies"]["plots"]) == {"matplotlib"}


def _block_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every matplotlib import fail, as on an install without it."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def _card() -> CapacityCard:
    """A small capacity search (a constant-service FIFO server, capacity 25 requests/s)."""
    return max_stable_load(capacity._doctest_scenario(), low=10.0, high=40.0, tolerance=0.5,
                           warmup_requests=50, measure_requests=300)


def test_capacity_save_writes_its_plot_or_fails_never_skips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A capacity card saves capacity.png with its tables; with matplotlib missing (a broken
    install) saving fails with ImportError instead of quietly leaving the plot out."""
    card = _card()
    names = sorted(p.name for p in card.save(tmp_path / "ok"))
    assert names == ["capacity.csv", "capacity.json", "capacity.md", "capacity.png"]
    _block_matplotlib(monkeypatch)
    with pytest.raises(ImportError):
        card.save(tmp_path / "broken")


def test_workload_histograms_leave_the_callers_pyplot_backend_alone(tmp_path: Path) -> None:
    """plot_histograms writes its three PNGs without switching matplotlib's backend (a notebook's
    inline plots keep working after `simpy-llm workload --plots`' function is called)."""
    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        frame = pd.DataFrame(
            {"client_id": ["a", "a", "b", "b"], "arrival_time_s": [0.0, 1.0, 0.5, 2.0],
             "input_tokens": [10, 20, 30, 40], "output_tokens": [1, 2, 3, 4]}
        )
        paths = plot_histograms(frame, tmp_path)
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(before)
    assert [p.name for p in paths] == ["hist_interarrival_s.png", "hist_input_tokens.png", "hist_output_tokens.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
