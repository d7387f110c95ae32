"""The emulated server sits beside the simulator core: the core never imports it."""

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
