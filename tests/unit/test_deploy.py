"""The deployment search (simpy_llm.explore.deploy, simpy-llm deploy): exact against the
exhaustive search, its cost arithmetic, its Pareto front, resuming, and refusing bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from simpy_llm.explore import deploy as deploy_module
from simpy_llm.explore.capacity import StabilityCriteria, _doctest_scenario, min_replicas
from simpy_llm.explore.deploy import DeployResult, deploy
from simpy_llm.serving.catalogue import gpu_prices

MODEL = "llama-3.1-8b-instruct"


def _scenario() -> dict[str, Any]:
    """Poisson arrivals of 500-token prompts with 50-token answers."""
    s = _doctest_scenario()
    client = s["workload"]["clients"][0]
    client["input_distribution"]["params"]["value"] = 500
    client["output_distribution"] = {"type": "constant", "params": {"value": 50}}
    return s


SPACE: dict[str, Any] = {
    "load": 8.0, "slo": {"ttft_p99": 0.3}, "gpus": ["H100", "A100-80"], "tp": [1, 2], "max_num_seqs": [1, 4],
    "model": MODEL, "warmup_requests": 30, "measure_requests": 150, "max_replicas": 16,
}
"""Eight configurations, a few seconds per search."""


@pytest.fixture(scope="module")
def exhaustive() -> DeployResult:
    return deploy(_scenario(), exhaustive=True, **SPACE)


@pytest.fixture(scope="module")
def pruned() -> DeployResult:
    return deploy(_scenario(), **SPACE)


def _answer(result: DeployResult) -> tuple[Any, ...]:
    best = result.best
    assert best is not None
    return (best.configuration, best.min_replicas, best.cost_per_hour, best.ttft_p99_s, best.tpot_p99_s)


def test_pruned_search_gives_the_exhaustive_answer(pruned: DeployResult, exhaustive: DeployResult) -> None:
    """Branch and bound names the same configuration, count and figures as searching every
    configuration to max_replicas: 3 x A100-80 TP1 with max_num_seqs 4."""
    assert _answer(pruned) == _answer(exhaustive)
    best = pruned.best
    assert best is not None
    assert (best.configuration.gpu, best.configuration.tp, best.configuration.max_num_seqs, best.min_replicas) == (
        "A100-80", 1, 4, 3)


def test_pruned_search_runs_fewer_simulations(pruned: DeployResult, exhaustive: DeployResult) -> None:
    """The bound saves simulations: 16 against the exhaustive 36, two configurations skipped
    without one (H100 TP2 costs more at one replica than the answer at three)."""
    assert (pruned.simulations, exhaustive.simulations) == (16, 36)
    assert (pruned.skipped, exhaustive.skipped) == (2, 0)
    skipped = [o.configuration.label() for o in pruned.outcomes if o.simulations == 0]
    assert skipped == ["H100 tp2 fcfs seqs=1 tokens=8192 whole-prefill", "H100 tp2 fcfs seqs=4 tokens=8192 whole-prefill"]


def test_every_loser_says_why(pruned: DeployResult, exhaustive: DeployResult) -> None:
    """Each configuration but the answer lost for a stated reason: costlier at its fewest
    replicas (exhaustive), or cut by the bound (pruned) at a count whose cost is above the answer's."""
    assert [o.status for o in exhaustive.outcomes].count("cheapest") == 1
    assert {o.status for o in exhaustive.outcomes} == {"cheapest", "costlier"}
    best = pruned.best
    assert best is not None
    for o in pruned.outcomes:
        if o.status == "pruned":
            assert o.configuration.cost(o.failing_replicas + 1) > best.cost_per_hour
            assert "cheapest found (7.495)" in o.reason
    assert [o.status for o in pruned.outcomes].count("costlier") == 1


def test_cost_is_replicas_times_tp_times_price(exhaustive: DeployResult) -> None:
    """A configuration's cost per hour is replicas x TP x the GPU's price per GPU-hour, and its
    requests/s per dollar the load over it (worked by hand for 3 x A100-80 TP1 and 2 x H100 TP2)."""
    prices = gpu_prices()
    assert (prices["A100-80"], prices["H100"]) == (2.4984, 3.9492)
    by_label = {o.configuration.label(): o for o in exhaustive.outcomes}
    a100 = by_label["A100-80 tp1 fcfs seqs=4 tokens=8192 whole-prefill"]
    assert a100.min_replicas == 3 and a100.cost_per_hour == pytest.approx(7.4952, abs=1e-12)
    assert a100.qps_per_usd_hour == pytest.approx(8.0 / 7.4952, rel=1e-12)
    h100 = by_label["H100 tp2 fcfs seqs=4 tokens=8192 whole-prefill"]
    assert h100.min_replicas == 2 and h100.cost_per_hour == pytest.approx(2 * 2 * 3.9492, abs=1e-12)


def test_pareto_front_matches_brute_force_dominance(exhaustive: DeployResult) -> None:
    """The front holds exactly the configurations meeting the SLOs that no other one is at
    least as good as on cost, p99 TTFT and p99 TPOT and better on one."""
    feasible = [o for o in exhaustive.outcomes if o.min_replicas is not None]

    def objectives(o: Any) -> tuple[float, float, float]:
        return (o.cost_per_hour, o.ttft_p99_s, o.tpot_p99_s)

    def dominates(a: Any, b: Any) -> bool:
        x, y = objectives(a), objectives(b)
        return all(p <= q for p, q in zip(x, y, strict=True)) and x != y

    brute = [o for o in feasible if not any(dominates(other, o) for other in feasible)]
    assert exhaustive.pareto() == brute
    assert 1 < len(brute) < len(feasible)


def test_each_count_is_min_replicas_of_that_configuration(exhaustive: DeployResult) -> None:
    """A configuration's fewest replicas is what min_replicas finds for the scenario with the
    configuration's settings (the same probes and criteria)."""
    o = exhaustive.outcomes[3]
    card = min_replicas(_scenario(), load=8.0, criteria=StabilityCriteria(slo={"ttft_p99": 0.3}),
                        overrides=o.configuration.overrides(), warmup_requests=30, measure_requests=150)
    assert card.min_replicas == o.min_replicas == 2


def test_resuming_a_run_directory_reruns_no_finished_configuration(tmp_path: Path, pruned: DeployResult,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A search stopped part-way, run again on its directory, gives the same answer; it reruns
    none of the configurations it had finished (their simulations are read back), and a third
    run reads every one back and simulates nothing."""
    real = deploy_module._run_probe
    calls = {"n": 0}

    def stop_after_ten(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] > 10:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(deploy_module, "_run_probe", stop_after_ten)
    with pytest.raises(KeyboardInterrupt):
        deploy(_scenario(), out=tmp_path, **SPACE)
    monkeypatch.setattr(deploy_module, "_run_probe", real)
    finished = len(list((tmp_path / "runs").glob("*.json")))
    assert finished == 1  # the first configuration's eight simulations; the second's search was cut after two
    resumed = deploy(_scenario(), out=tmp_path, **SPACE)
    assert _answer(resumed) == _answer(pruned)
    assert (resumed.loaded, resumed.simulations) == (8, pruned.simulations - 8)
    assert resumed.to_frame().equals(pruned.to_frame())  # the same search, half of it read back
    again = deploy(_scenario(), out=tmp_path, **SPACE)
    assert (again.loaded, again.simulations) == (pruned.simulations, 0)
    assert _answer(again) == _answer(pruned)
    written = json.loads((tmp_path / "deploy.json").read_text())
    assert written["best"]["min_replicas"] == 3 and written["simulations"] == 0


def test_budget_below_every_configuration_is_an_answer() -> None:
    """A budget no configuration fits under gives "none fits" (no best, each over budget)
    without a simulation, not an error."""
    result = deploy(_scenario(), **{**SPACE, "budget": 2.0})
    assert result.best is None
    assert {o.status for o in result.outcomes} == {"over_budget"}
    assert result.simulations == 0
    assert "none fits" in result.to_markdown()


def test_budget_cuts_the_count_search() -> None:
    """A budget between one and two A100-80 GPUs keeps each configuration to the counts it
    affords: A100-80 TP1 with max_num_seqs 4 needs 3, so nothing fits under 5 USD/h."""
    result = deploy(_scenario(), **{**SPACE, "budget": 5.0})
    assert result.best is None
    assert all(o.status == "over_budget" for o in result.outcomes)
    assert max(o.failing_replicas for o in result.outcomes) == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gpus": ["B200"]}, "gpus: unknown GPU 'B200'; known GPUs: A100-80, H100, L40S"),
        ({"gpus": ["L40S"]}, "no catalogue row for model 'llama-3.1-8b-instruct' on L40S with tp in [1, 2]; it has: A100-80 tp1, H100 tp1"),
        ({"model": "llama-9b"}, "no catalogue row for model 'llama-9b'; the catalogue's models: "),
        ({"model": "llama-3.3-70b-instruct", "gpus": ["A100-80"]}, "it has: H100 tp4, H100 tp8"),
        ({"schedulers": ["lifo"]}, "schedulers: 'lifo' is not allowed; allowed: "),
        ({"max_num_seqs": [0]}, "max_num_seqs: 0 is not allowed; allowed: integers >= 1"),
        ({"prices": {"H100": 3.0}}, "gpus: no price for A100-80 in the price table (it has: H100)"),
        ({"executor": "threads"}, "executor must be one of serial, process, dask"),
    ],
)
def test_bad_arguments_are_refused_with_their_name(change: dict[str, Any], message: str) -> None:
    """An unknown GPU, model or scheduler, a GPU without a catalogue row or a price, an axis
    value out of range and an unknown executor are refused before any simulation, naming the
    argument and what is allowed."""
    with pytest.raises(ValueError) as info:
        deploy(_scenario(), **{**SPACE, **change})
    assert message in str(info.value)


def test_command_writes_the_three_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """simpy-llm deploy prints the answer and writes deploy.json, deploy.csv and deploy.md."""
    from simpy_llm.cli import main

    path = tmp_path / "s.json"  # JSON is YAML
    path.write_text(json.dumps(_scenario()))
    code = main(["deploy", str(path), "--load", "8", "--slo", "ttft_p99=0.3", "--gpus", "A100-80", "--tp", "1",
                 "--max-num-seqs", "4", "--model", MODEL, "--warmup-requests", "30", "--measure-requests", "150",
                 "--executor", "serial", "--quiet", "--out", str(tmp_path / "out")])
    assert code == 0
    assert "**answer**: 3 x A100-80 tp1 fcfs seqs=4" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["deploy.csv", "deploy.json", "deploy.md", "runs"]
    frame_header = (tmp_path / "out" / "deploy.csv").read_text().splitlines()[0]
    assert frame_header.startswith("index,gpu,tp,scheduler") and frame_header.endswith(",pareto")


def test_command_refuses_an_unknown_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """simpy-llm deploy with an unknown GPU exits with status 2 and says which GPUs exist."""
    from simpy_llm.cli import main

    quickstart = Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml"
    code = main(["deploy", str(quickstart), "--load", "8", "--slo", "ttft_p99=0.3", "--gpus", "B200"])
    assert code == 2
    assert "gpus: unknown GPU 'B200'" in capsys.readouterr().err


def test_configuration_cost_is_exact_arithmetic() -> None:
    """Configuration.cost is replicas x tp x price with no rounding of its own."""
    c = deploy_module.Configuration(index=0, model=MODEL, gpu="A100-80", tp=2, scheduler="fcfs", max_num_seqs=4,
                                    max_num_batched_tokens=8192, chunked_prefill=False, price_per_gpu_hour=2.4984,
                                    kv_auto=True)
    assert c.cost(3) == 3 * 2 * 2.4984
    assert math.isclose(c.cost(5), 24.984)
