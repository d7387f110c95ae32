"""The deployment search over disaggregated fleets (deploy(..., disaggregated=True)): the
two-count search is exact against the exhaustive one, a heterogeneous fleet wins where it
should, the P:D split reaches every output, and bad arguments are refused."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest

from simpy_llm.explore.capacity import StabilityCriteria, _doctest_scenario
from simpy_llm.explore.capacity.probing import _run_probe, _window
from simpy_llm.explore.capacity.searches import cheapest_pair
from simpy_llm.explore.deploy import DeployResult, deploy
from simpy_llm.explore.deploy_pools import DECODE_KEY, PREFILL_KEY, pool_overrides
from simpy_llm.serving.catalogue import gpu_prices

MODEL = "llama-3.1-8b-instruct"


# --- the two-count search on its own -------------------------------------------------
def _monotone_grid(rng: random.Random, size: int) -> set[tuple[int, int]]:
    """A random set of passing pairs closed upwards in both counts (a staircase)."""
    need = sorted((rng.randint(1, size + 1) for _ in range(size)), reverse=True)  # fewest d per p, non-increasing
    start = rng.randint(1, size)
    return {(p, d) for p in range(1, size + 1) for d in range(1, size + 1) if p >= start and d >= need[p - 1]}


def test_cheapest_pair_is_the_brute_force_minimum() -> None:
    """On 300 random monotone grids and prices, the search returns the cheapest passing pair
    within the total (ties to the smaller P), with the bound and without it."""
    rng = random.Random(3)
    for _ in range(300):
        size = rng.randint(2, 9)
        grid = _monotone_grid(rng, size)
        cp, cd = rng.choice([1.0, 2.0, 2.5, 4.0]), rng.choice([1.0, 1.5, 3.0])

        def cost(p: int, d: int, cp: float = cp, cd: float = cd) -> float:
            return p * cp + d * cd

        pairs = [(p, d) for p, d in itertools.product(range(1, size + 1), repeat=2) if p + d <= size and (p, d) in grid]
        brute = min(pairs, key=lambda x: (cost(*x), x[0]), default=None)
        assert cheapest_pair(lambda p, d, g=grid: (p, d) in g, cost, size) == brute
        assert cheapest_pair(lambda p, d, g=grid: (p, d) in g, cost, size, bound=False) == brute


def test_cheapest_pair_bound_saves_probes() -> None:
    """The bound asks fewer pairs than the search without it: on the docstring's staircase
    (P >= 2 and P x D >= 6 pass, P costs 3, D costs 1, 12 replicas at most), 9 against 14."""
    for bound, expected in ((True, 9), (False, 14)):
        asked: list[tuple[int, int]] = []

        def passes(p: int, d: int, asked: list[tuple[int, int]] = asked) -> bool:
            asked.append((p, d))
            return p >= 2 and p * d >= 6

        assert cheapest_pair(passes, lambda p, d: 3.0 * p + d, 12, bound=bound) == (2, 3)
        assert len(asked) == expected


# --- the search over disaggregated fleets ---------------------------------------------
def _scenario() -> dict[str, Any]:
    """Poisson arrivals of 2,000-token prompts with 40-token answers: prefill-heavy."""
    s = _doctest_scenario()
    client = s["workload"]["clients"][0]
    client["input_distribution"]["params"]["value"] = 2000
    client["output_distribution"] = {"type": "constant", "params": {"value": 40}}
    s["serving"]["engine"] = {"max_num_seqs": 16, "max_num_batched_tokens": 4096, "chunked_prefill": False}
    return s


SPACE: dict[str, Any] = {
    "load": 32.0, "slo": StabilityCriteria(slo={"ttft_p99": 0.5, "tpot_p99": 0.03}, max_backlog_growth=0.05),
    "gpus": ["H100", "A100-80"], "tp": [1], "max_num_seqs": [64], "model": MODEL, "warmup_requests": 100,
    "measure_requests": 200, "max_replicas": 6, "disaggregated": True,
}
"""Two co-located and four disaggregated configurations (every pair of the H100 and A100-80
rows at TP 1), up to six replicas each, a second of simulations per pair."""


@pytest.fixture(scope="module")
def pruned() -> DeployResult:
    return deploy(_scenario(), **SPACE)


@pytest.fixture(scope="module")
def exhaustive() -> DeployResult:
    return deploy(_scenario(), exhaustive=True, **SPACE)


def _grid(config: Any) -> dict[tuple[int, int], bool]:
    """Every pair of *config* with at most six replicas, simulated as the search simulates it."""
    from simpy_llm.config.plain import unstructure
    from simpy_llm.loading import scenario_from_dict

    s = _scenario()
    window = _window(SPACE["warmup_requests"], SPACE["measure_requests"], None, None)
    criteria = SPACE["slo"]
    engine = unstructure(scenario_from_dict(s).serving.engine)
    fixed = {**window.overrides(), "workload.aggregate_rate": SPACE["load"], **pool_overrides(config, engine, {})}
    total = SPACE["max_replicas"]
    return {
        (p, d): _run_probe(s, {**fixed, PREFILL_KEY: p, DECODE_KEY: d}, load=SPACE["load"], replicas=p + d, window=window,
                           criteria=criteria).meets_slo
        for p in range(1, total) for d in range(1, total - p + 1)
    }


def _best(result: DeployResult) -> tuple[Any, ...]:
    best = result.best
    assert best is not None
    return (best.configuration, best.prefill_replicas, best.decode_replicas, best.cost_per_hour, best.ttft_p99_s,
            best.tpot_p99_s)


@pytest.fixture(scope="module")
def grid(pruned: DeployResult) -> dict[tuple[int, int], bool]:
    """The winning configuration's every pair, simulated."""
    return _grid(pruned.outcomes[4].configuration)


def test_disaggregated_search_gives_the_exhaustive_answer(pruned: DeployResult, exhaustive: DeployResult) -> None:
    """Branch and bound over the configurations and the (P, D) pairs names the same
    configuration, split, cost and latencies as searching every pair of every configuration:
    2 H100 prefill replicas handing off to 1 A100-80 decode replica."""
    assert _best(pruned) == _best(exhaustive)
    best = pruned.best
    assert best is not None and best.configuration.decode is not None
    c = best.configuration
    assert (c.gpu, c.tp, c.decode.gpu, c.decode.tp, best.prefill_replicas, best.decode_replicas, best.min_replicas) == (
        "H100", 1, "A100-80", 1, 2, 1, 3)


def test_disaggregated_search_matches_every_pair_simulated(pruned: DeployResult, grid: dict[tuple[int, int], bool]) -> None:
    """The answer's split is the cheapest of the fifteen pairs of at most six replicas, each
    simulated; the search ran four of them."""
    config = pruned.outcomes[4].configuration
    passing = [pair for pair, meets in grid.items() if meets]
    assert min(passing, key=lambda pair: (config.cost(*pair), pair[0])) == (2, 1)
    assert (len(grid), pruned.outcomes[4].simulations) == (15, 4)


def test_more_replicas_in_either_pool_never_fail(grid: dict[tuple[int, int], bool]) -> None:
    """The assumption of the two-count search holds on this case: every pair at least as large
    in both counts as a passing pair passes (and some pairs fail, some pass)."""
    for (p, d), meets in grid.items():
        if meets:
            assert all(grid[(q, e)] for (q, e) in grid if q >= p and e >= d)
    assert {True, False} == set(grid.values())


def test_bound_saves_simulations(pruned: DeployResult, exhaustive: DeployResult) -> None:
    """The bound over configurations and pairs runs 23 simulations against the exhaustive 40:
    H100 prefill with H100 decode is settled by one (1P+1D fails; 2P+1D costs more than the answer)."""
    assert (pruned.simulations, exhaustive.simulations) == (23, 40)
    assert [o.simulations for o in pruned.outcomes] == [4, 4, 6, 4, 4, 1]
    assert pruned.outcomes[5].status == "pruned"
    assert "no more than the cheapest found (10.4)" in pruned.outcomes[5].reason


def test_heterogeneous_answer_costs_each_pool_at_its_price(pruned: DeployResult) -> None:
    """The answer costs 2 x 1 x 3.9492 (H100 prefill) + 1 x 1 x 2.4984 (A100-80 decode) =
    10.3968 USD/h, less than the cheapest co-located fleet, 3 H100s at 11.8476."""
    prices = gpu_prices()
    assert (prices["H100"], prices["A100-80"]) == (3.9492, 2.4984)
    best = pruned.best
    assert best is not None
    assert best.cost_per_hour == 2 * 1 * 3.9492 + 1 * 1 * 2.4984 == pytest.approx(10.3968, abs=1e-12)
    assert best.qps_per_usd_hour == 32.0 / best.cost_per_hour
    colocated = pruned.outcomes[1]
    assert (colocated.configuration.gpu, colocated.min_replicas, colocated.status) == ("H100", 3, "costlier")
    assert colocated.cost_per_hour == pytest.approx(3 * 3.9492, abs=1e-12)


def test_outputs_give_the_split(tmp_path: Path, pruned: DeployResult) -> None:
    """deploy.json, deploy.csv, deploy.md and the printed table give the P:D split and the
    decode pool's row; co-located rows leave them empty."""
    pruned.save(tmp_path)
    data = json.loads((tmp_path / "deploy.json").read_text())
    assert data["disaggregated"] is True
    best = data["best"]
    assert (best["gpu"], best["decode_gpu"], best["prefill_replicas"], best["decode_replicas"]) == ("H100", "A100-80", 2, 1)
    assert data["configurations"][1]["decode_gpu"] is None and data["configurations"][1]["disaggregated"] is False
    header = (tmp_path / "deploy.csv").read_text().splitlines()[0].split(",")
    assert {"disaggregated", "decode_gpu", "decode_tp", "prefill_replicas", "decode_replicas"} <= set(header)
    text = (tmp_path / "deploy.md").read_text()
    assert "**answer**: 2 x H100 tp1 prefill + 1 x A100-80 tp1 decode, fcfs seqs=64" in text
    assert "(P:D 2:1, 3 GPUs;" in text
    assert "| 4 | H100 tp1 prefill + A100-80 tp1 decode fcfs seqs=64 tokens=4096 whole-prefill | cheapest | 2P+1D |" in text


def test_resuming_reruns_no_pair(tmp_path: Path, pruned: DeployResult) -> None:
    """A disaggregated search run again on its run directory simulates nothing and gives the
    same answer, every verdict read back."""
    first = deploy(_scenario(), out=tmp_path, **SPACE)
    again = deploy(_scenario(), out=tmp_path, **SPACE)
    assert (first.simulations, again.simulations, again.loaded) == (pruned.simulations, 0, pruned.simulations)
    assert _best(again) == _best(pruned)


def test_disaggregated_scenario_keeps_its_hand_off() -> None:
    """A disaggregated scenario's KV hand-off is the searched pools' (a 1 Gbit/s link: 2,000
    tokens of KV take about 2 s, so no split meets a 0.5 s TTFT), and its co-located
    configuration drops the split."""
    s = _scenario()
    s["serving"]["replicas"] = 2
    s["serving"]["disaggregation"] = {"prefill_replicas": 1, "kv_transfer": {"bandwidth_gbps": 1.0}}
    result = deploy(s, **{**SPACE, "gpus": ["H100"], "load": 4.0})
    colocated, pooled = result.outcomes
    assert (colocated.configuration.decode, colocated.status, colocated.min_replicas) == (None, "cheapest", 1)
    assert pooled.status == "pruned" and pooled.simulations == 0
    alone = deploy(s, **{**SPACE, "gpus": ["H100"], "load": 4.0, "exhaustive": True})
    assert alone.outcomes[1].status == "misses_slo"
    assert alone.outcomes[1].reason == "misses the criteria with every P:D split of up to 6 replicas"


def _topology(s: dict[str, Any]) -> dict[str, Any]:
    s["serving"]["replicas"] = 2
    s["serving"]["disaggregation"] = {"prefill_replicas": 1, "topology": {
        "type": "complete", "endpoints": ["prefill/0", "decode/0"], "rtt_ms": 0.01, "bandwidth_mbps": 100000}}
    return s


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"disaggregated": False, "prefill_gpus": ["H100"]},
         "prefill_gpus and decode_gpus choose a disaggregated fleet's pools: give disaggregated=True"),
        ({"decode_gpus": ["B200"]}, "decode_gpus: unknown GPU 'B200'; known GPUs: A100-80, H100, L40S"),
        ({"prefill_gpus": ["L40S"]}, "no catalogue row for model 'llama-3.1-8b-instruct' on L40S with tp in [1]"),
        ({"model": "gpt-oss-20b", "gpus": ["H100"]},
         "disaggregated: no disaggregated configuration can be searched: the model openai/gpt-oss-20b cannot be "
         "disaggregated on H100 tp1"),
        ({"scenario": _topology}, "disaggregated: serving.disaggregation.topology names a fixed set of replicas"),
        ({"disaggregated": False, "scenario": _topology}, "(a disaggregated scenario's pools are, with disaggregated=True"),
    ],
)
def test_bad_arguments_are_refused(change: dict[str, Any], message: str) -> None:
    """Pool GPUs without a disaggregated search, an unknown GPU or one without a row for a pool,
    a model whose KV hand-off has no size, and a scenario's fixed topology are refused before
    any simulation, naming the argument."""
    change = dict(change)
    scenario = change.pop("scenario", lambda s: s)(_scenario())
    with pytest.raises(ValueError) as info:
        deploy(scenario, **{**SPACE, **change})
    assert message in str(info.value)


def _command(tmp_path: Path, *extra: str) -> int:
    from simpy_llm.cli import main

    path = tmp_path / "s.json"  # JSON is YAML
    path.write_text(json.dumps(_scenario()))
    return main(["deploy", str(path), "--load", "4", "--slo", "ttft_p99=0.5", "--gpus", "H100", "--tp", "1",
                 "--max-num-seqs", "64", "--model", MODEL, "--warmup-requests", "100", "--measure-requests", "1000",
                 "--max-replicas", "4", "--executor", "serial", "--quiet", *extra])


def test_command_searches_the_pools_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """simpy-llm deploy --disaggregated --prefill-gpus H100 --decode-gpus A100-80 adds the one
    heterogeneous configuration to the co-located H100 and reports its split."""
    code = _command(tmp_path, "--disaggregated", "--prefill-gpus", "H100", "--decode-gpus", "A100-80")
    out = capsys.readouterr().out
    assert code == 0
    assert "**answer**: 1 x H100 tp1 fcfs seqs=64" in out
    assert "| 1 | H100 tp1 prefill + A100-80 tp1 decode fcfs seqs=64 tokens=4096 whole-prefill |" in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--prefill-gpus", "H100"), "prefill_gpus and decode_gpus choose a disaggregated fleet's pools"),
        (("--speculation", "maybe"), "--speculation: 'maybe' is not allowed"),
    ],
)
def test_command_refuses_bad_pool_options(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: tuple[str, ...],
                                          message: str) -> None:
    """Pool GPUs without --disaggregated and a --speculation value other than on or off exit
    with status 2 and say why."""
    assert _command(tmp_path, *extra) == 2
    assert message in capsys.readouterr().err
