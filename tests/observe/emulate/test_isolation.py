"""The emulated server and the calibrator sit beside the simulator core: the core never imports them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

QUICKSTART = Path(__file__).resolve().parents[3] / "scenarios" / "quickstart.yaml"


def test_core_and_cli_do_not_import_the_emulator() -> None:
    """Importing simpy_llm and the CLI and running a simulation loads neither
    simpy_llm.observe (the emulated server included) nor aiohttp."""
    code = (
        "import sys, simpy_llm, simpy_llm.cli\n"
        "from simpy_llm import Simulation, load_scenario\n"
        f"Simulation(load_scenario({str(QUICKSTART)!r}, ['workload.num_requests=5'])).run()\n"
        "print(sorted(m for m in sys.modules if m.startswith(('simpy_llm.observe', 'aiohttp'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_simulation_without_traces_loads_neither_pandas_nor_the_calibrator():
    """Running a scenario without trace replays imports no pandas (the trace module and the
    results' frames load it only when asked) and nothing of the calibrator: a simulation's
    memory is its own (a peak of ~100 MB at 100k requests, not ~175 MB)."""
    code = (
        "import sys\n"
        "from simpy_llm import Simulation, load_scenario\n"
        f"Simulation(load_scenario({str(QUICKSTART)!r}, ['workload.num_requests=5'])).run()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pandas', 'pyarrow') or m.startswith('simpy_llm.calibrate')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
