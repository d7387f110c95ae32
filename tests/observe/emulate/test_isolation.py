"""The emulated server and the calibrator sit beside the simulator core: the core never imports them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

QUICKSTART = Path(__file__).resolve().parents[3] / "scenarios" / "quickstart.yaml"


def _loaded_by_a_run(wanted: str) -> str:
    """The modules for which the expression *wanted* (over ``m``) holds, sorted, after a fresh
    interpreter imported simpy_llm and its CLI and ran a short quickstart simulation."""
    code = (
        "import sys, simpy_llm, simpy_llm.cli\n"
        "from simpy_llm import Simulation, load_scenario\n"
        f"Simulation(load_scenario({str(QUICKSTART)!r}, ['workload.num_requests=5'])).run()\n"
        f"print(sorted(m for m in sys.modules if {wanted}))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_core_and_cli_do_not_import_the_emulator() -> None:
    """Importing simpy_llm and the CLI and running a simulation loads neither
    simpy_llm.observe (the emulated server included) nor aiohttp."""
    assert _loaded_by_a_run("m.startswith(('simpy_llm.observe', 'aiohttp'))") == "[]"


def test_a_simulation_without_traces_loads_neither_pandas_nor_the_calibrator():
    """Running a scenario without trace replays imports no pandas (the trace module and the
    results' frames load it only when asked) and nothing of the calibrator: a simulation's
    memory is its own (a peak of ~100 MB at 100k requests, not ~175 MB)."""
    assert _loaded_by_a_run("m.split('.')[0] in ('pandas', 'pyarrow') or m.startswith('simpy_llm.calibrate')") == "[]"
