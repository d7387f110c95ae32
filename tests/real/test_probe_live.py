"""``calibrate probe`` against the real llama.cpp server: the designed measurement works.

Not an accuracy test (the machine's cores are shared and the server's step times move two- to
three-fold with other work on them): the probe keeps to its budget, every phase produces samples
on llama.cpp (its prompt cache and host-memory cache included), and the profile it writes is a
latency model with a decode table of one entry per slot. The figures are printed for the record.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from simpy_llm import Simulation
from simpy_llm.calibrate.probe import DEFAULT_MAX_SECONDS, run_probe
from simpy_llm.loading import load_scenario
from simpy_llm.observe.llamacpp import LlamaCppServer
from simpy_llm.serving.batch_table import BatchTableLatency

pytestmark = pytest.mark.real_server

BUDGET_S = DEFAULT_MAX_SECONDS
"""The probe's budget here: its default (a shorter one leaves the last phases out on a busy machine)."""

IN_FLIGHT_S = 5.0
"""What a request sent just before the deadline may add: a phase is started only when its planned
time fits, and a request is sent only while time is left."""


def test_the_probe_measures_the_llamacpp_server(llamacpp_server: LlamaCppServer, tmp_path: Path):
    """The probe of the shared server (4 slots, one thread, prompt cache and host-memory cache on)
    keeps to its budget; its isolated, decode (every batch size 1-4), mixed, extension and restore
    phases all give samples; the profile loads as a scenario's latency model and its coefficients
    are not negative, the decode table and the per-token time positive."""
    out = tmp_path / "probe"
    result = run_probe(
        llamacpp_server.url, out, server_type="llamacpp", server_config={"server": llamacpp_server.config.server_block()},
        max_seconds=BUDGET_S,
    )
    stats = result.statistics
    print(yaml.safe_dump({"params": result.params, "intervals": result.intervals, "warnings": result.warnings,
                          "duration_s": stats["duration_s"], "design": stats["design"]}, sort_keys=False))
    assert stats["duration_s"] <= BUDGET_S + IN_FLIGHT_S
    assert stats["isolated"]["requests"] >= 8 and stats["isolated"]["decode_gaps"] >= 8
    parallel = llamacpp_server.config.parallel
    assert sorted(stats["decode"]["gaps"]) == list(range(1, parallel + 1))
    assert min(stats["decode"]["gaps"].values()) >= 6
    assert stats["mixed"]["mixed_steps"] >= 1
    assert stats["extension"]["samples"] >= 1 and stats["restore"]["samples"] >= 1
    assert stats["skipped"] == {}

    decode = result.params["decode_step_us"]
    assert len(decode) == parallel and result.sources["decode_step_us"] == ["probe"] * parallel
    assert all(d > 0 for d in decode) and result.params["prefill_token_us"] > 0
    assert all(v >= 0 for k, v in result.params.items() if k != "decode_step_us")

    scenario_file = tmp_path / "scenario.yaml"
    scenario_file.write_text(yaml.safe_dump({
        "workload": {"aggregate_rate": 1.0, "num_requests": 2, "clients": [{
            "id": "a", "arrival": {"process": "poisson"},
            "input_distribution": {"type": "constant", "params": {"value": 50}},
            "output_distribution": {"type": "constant", "params": {"value": 5}}}]},
        "serving": {"engine": {"preset": "llamacpp", "n_parallel": parallel, "ctx_per_slot": llamacpp_server.config.ctx_per_slot},
                    "latency_model": {"profile": str(out / "profile.yaml")}},
    }))
    model = Simulation(load_scenario(scenario_file)).replicas[0].latency
    assert isinstance(model, BatchTableLatency) and list(model.decode_step_us) == pytest.approx(decode, rel=1e-5)
