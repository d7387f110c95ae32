"""The tutorial notebooks: each runs top to bottom without an error, and is committed without outputs.

Every ``notebooks/*.ipynb`` is executed in a fresh ``python3`` kernel by nbclient, from
the ``notebooks/`` folder (as Jupyter would run it). The notebook that starts a real
llama.cpp server is marked ``real_server``, like the tests in ``tests/real/`` (it skips without the
``real-server`` extra); a notebook whose kernel needs another extra skips without it.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

NEEDS_NOTEBOOKS = "needs the notebooks extra ({}): pip install -e '.[notebooks]'"

nbformat = pytest.importorskip("nbformat", reason=NEEDS_NOTEBOOKS.format("nbformat"))

NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
REAL_SERVER = {"07_observe_and_calibrate.ipynb"}
"""Notebooks that start a real llama.cpp server (the ``real-server`` extra)."""

KERNEL_MODULES = {"08_capacity_study_dask.ipynb": ("distributed",)}
"""Per notebook, the modules of the ``notebooks`` extra its code imports, beyond simpy_llm's dependencies."""

TIMEOUT_S = 300
"""Per-cell timeout: generous, for a loaded CI machine (each notebook takes well under a minute)."""


def _importable(name: str) -> bool:
    """Whether *name* can be imported (the kernel is this interpreter: ``python3``, from ipykernel)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def _param(path: Path) -> pytest.param:
    marks = [pytest.mark.real_server] if path.name in REAL_SERVER else []
    return pytest.param(path, id=path.stem, marks=marks)


def test_there_are_notebooks():
    """The notebooks folder holds the tutorials (a wrong path would make the tests below vanish)."""
    assert len(NOTEBOOKS) >= 7


# No warning filter is needed here (checked with nbclient 0.11 / jupyter_client on Python 3.11):
# the kernel runs in its own process, and its stderr (e.g. "Kernel is running over TCP without
# encryption") is not a Python warning in the test process.
@pytest.mark.parametrize("path", [_param(p) for p in NOTEBOOKS])
def test_notebook_runs(path: Path):
    """The notebook executes top to bottom in a fresh kernel without a cell raising an error."""
    nbclient = pytest.importorskip("nbclient", reason=NEEDS_NOTEBOOKS.format("nbclient"))
    missing = [name for name in ("ipykernel", *KERNEL_MODULES.get(path.name, ())) if not _importable(name)]
    if missing:
        pytest.skip(NEEDS_NOTEBOOKS.format(", ".join(missing)))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS_DIR)}}
    )
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError naming the cell and the exception
    # Reported, not asserted (no wall-clock assertions in tests): see with `pytest -s`.
    print(f"{path.name}: executed in {time.perf_counter() - start:.1f} s")
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert errors == []


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path: Path):
    """Every code cell of the committed notebook has no outputs and a null execution count."""
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "a notebook without code cells"
    assert [c.outputs for c in code] == [[] for _ in code]
    assert [c.execution_count for c in code] == [None for _ in code]
