"""Pipeline stages as an axis of the deployment search (``deploy(..., pp=[...])``, ``--pp``).

A row at ``pp > 1`` runs the calibrated roofline of its model, GPU and TP with that many
stages (no catalogue row measures pipeline stages) and costs ``replicas x tp x pp x price``.
The spaces are small (Llama-3.1-8B or CodeLlama-34B on one H100 at TP 1, a few hundred
requests per simulation), so each search takes about a second.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from simpy_llm.cli import main as cli_main
from simpy_llm.explore.capacity import _doctest_scenario
from simpy_llm.explore.deploy import Configuration, DeployResult, deploy
from simpy_llm.explore.deploy_day import per_day
from simpy_llm.serving.hardware import Hardware, auto_kv_blocks, gpu_spec, model_spec

H100 = 3.9492
"""The shipped H100 price, USD per GPU-hour (profiles/gpu_prices.yaml)."""


def _scenario(prompt: int = 500, answer: int = 50) -> dict[str, Any]:
    """Poisson arrivals of *prompt*-token prompts with *answer*-token answers."""
    s = _doctest_scenario()
    client = s["workload"]["clients"][0]
    client["input_distribution"]["params"]["value"] = prompt
    client["output_distribution"] = {"type": "constant", "params": {"value": answer}}
    return s


SMALL: dict[str, Any] = {
    "load": 6.0, "slo": {"ttft_p99": 0.3}, "gpus": ["H100"], "tp": [1], "max_num_seqs": [2, 4],
    "model": "llama-3.1-8b-instruct", "warmup_requests": 30, "measure_requests": 150, "max_replicas": 8,
}
"""Llama-3.1-8B on one H100 at TP 1, max_num_seqs 2 and 4: with pp [1, 2], four configurations."""


@pytest.fixture(scope="module")
def pruned() -> DeployResult:
    return deploy(_scenario(), pp=[1, 2], **SMALL)


@pytest.fixture(scope="module")
def exhaustive() -> DeployResult:
    return deploy(_scenario(), pp=[1, 2], exhaustive=True, **SMALL)


def test_pp_row_runs_the_calibrated_roofline() -> None:
    """A configuration at pp 2 sets the roofline with calibrated efficiencies at its model,
    GPU, TP and stages, with the KV cache sized from memory; at pp 1 the catalogue row."""
    c = Configuration(index=0, model="meta-llama/llama-3.1-8b-instruct", gpu="H100", tp=1, scheduler="fcfs",
                      max_num_seqs=4, max_num_batched_tokens=2048, chunked_prefill=True, price_per_gpu_hour=H100,
                      kv_auto=True)
    assert attrs.evolve(c, pp=2).overrides()["serving.latency_model"] == {
        "kind": "roofline",
        "params": {"model": "meta-llama/llama-3.1-8b-instruct", "gpu": "H100", "tp": 1, "pp": 2, "efficiency": "calibrated"},
    }
    assert c.overrides()["serving.latency_model"]["kind"] == "blis_linear"
    assert attrs.evolve(c, pp=2).overrides()["serving.engine.kv_num_blocks"] == "auto"


def test_pp_cost_is_replicas_tp_pp_price(exhaustive: DeployResult) -> None:
    """A pp 2 configuration's cost is its replicas x tp x pp x price: 2 x 1 x 2 x 3.9492 for
    two replicas of two GPUs each; its row and label say pp 2."""
    staged = [o for o in exhaustive.outcomes if o.configuration.pp == 2]
    assert [o.configuration.index for o in staged] == [2, 3]
    by_index = {o.configuration.index: o for o in staged}
    assert by_index[3].min_replicas == 2
    assert by_index[3].cost_per_hour == 2 * 1 * 2 * H100
    assert by_index[2].min_replicas is not None
    assert by_index[2].cost_per_hour == by_index[2].min_replicas * 1 * 2 * H100
    assert by_index[3].row(pp=True)["pp"] == 2
    assert by_index[3].configuration.label().startswith("H100 tp1 pp2 ")


def test_pruned_search_with_pp_equals_exhaustive(pruned: DeployResult, exhaustive: DeployResult) -> None:
    """With pp [1, 2] the pruned search names the exhaustive search's answer (one H100 at pp
    1, max_num_seqs 4, 3.9492 USD/h) with 3 simulations against 9: both pp 2 configurations
    cost 7.8984 USD/h at one replica, above that answer, so they are skipped unsimulated."""
    for result in (pruned, exhaustive):
        best = result.best
        assert best is not None
        assert (best.configuration.index, best.configuration.pp, best.min_replicas, best.cost_per_hour) == (1, 1, 1, H100)
    assert (pruned.simulations, exhaustive.simulations) == (3, 9)
    assert pruned.skipped == 2
    assert [o.status for o in pruned.outcomes] == ["costlier", "cheapest", "pruned", "pruned"]
    assert [o.simulations for o in pruned.outcomes[2:]] == [0, 0]


def test_pp2_wins_when_the_kv_cache_of_one_gpu_is_too_small() -> None:
    """CodeLlama-34B's weights (68 GB) fill one H100, leaving 1,244 KV blocks of 16 tokens
    (about four 4,200-token requests); at pp 2 each GPU holds half the layers and 23,943
    blocks. At 2 requests/s of 4,000-token prompts one pp 2 replica (2 GPUs) carries the
    load, while pp 1 replicas, bound by their KV cache, need five."""
    hw = {pp: Hardware(model=model_spec("codellama-34b-instruct-hf"), gpu=gpu_spec("H100"), tp=1, pp=pp) for pp in (1, 2)}
    assert (auto_kv_blocks(hw[1], 16), auto_kv_blocks(hw[2], 16)) == (1244, 23943)
    result = deploy(_scenario(4000, 200), load=2.0, slo={"ttft_p99": 2.0}, gpus=["H100"], pp=[1, 2], max_num_seqs=[64],
                    model="codellama-34b-instruct-hf", warmup_requests=30, measure_requests=150, max_replicas=6)
    best = result.best
    assert best is not None
    assert (best.configuration.pp, best.min_replicas, best.cost_per_hour) == (2, 1, 2 * H100)
    single = result.outcomes[0]
    assert (single.configuration.pp, single.status, single.min_replicas) == (1, "costlier", 5)


def test_outputs_show_pp_only_when_searched(pruned: DeployResult) -> None:
    """Without pp (or with pp [1]) the results have no pp column and equal each other; with
    pp [1, 2] every row has pp after tp and the JSON says so."""
    plain = deploy(_scenario(), **SMALL)
    one = deploy(_scenario(), pp=[1], **SMALL)
    assert plain.to_dict() == one.to_dict()
    assert plain.to_markdown() == one.to_markdown()
    assert "pp" not in plain.to_dict() and "pp" not in plain.to_frame().columns
    data = pruned.to_dict()
    assert data["pp"] is True
    assert list(data["configurations"][0])[:4] == ["index", "gpu", "tp", "pp"]
    assert [row["pp"] for row in data["configurations"]] == [1, 1, 2, 2]


def test_static_day_cost_counts_pp() -> None:
    """Over a day a pp 2 configuration costs mean replicas x tp x pp x price x 24."""
    c = Configuration(index=0, model="m", gpu="H100", tp=2, scheduler="fcfs", max_num_seqs=8,
                      max_num_batched_tokens=512, chunked_prefill=True, price_per_gpu_hour=3.5, kv_auto=False, pp=2)
    assert per_day(3, c) == 3 * 2 * 2 * 3.5 * 24


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"pp": [0]}, "pp: 0 is not allowed; allowed: integers >= 1"),
    ({"pp": [33]}, "pp: 33 stages are more than meta-llama/llama-3.1-8b-instruct's 32 decoder layers; allowed: 1 to 32"),
    ({"pp": [2], "model": "gpt-oss-20b"}, "has no shipped model configuration"),
    ({"pp": [1, 2], "disaggregated": True}, "pp: pipeline stages with disaggregated"),
    ({"pp": []}, "pp is empty"),
])
def test_bad_pp_is_refused(kwargs: dict[str, Any], message: str) -> None:
    """A pp the roofline cannot take, pp without a model configuration, pp with a
    disaggregated search or an empty pp is refused before any simulation, naming pp."""
    space = {**SMALL, **kwargs}
    with pytest.raises(ValueError, match="pp") as info:
        deploy(_scenario(), **space)
    assert message in str(info.value)


def test_pp_that_is_not_a_list_is_refused() -> None:
    """pp must be a list of integers."""
    with pytest.raises(TypeError, match="pp must be a list"):
        deploy(_scenario(), **{**SMALL, "pp": 2})


def test_cli_refuses_a_bad_pp(capsys: pytest.CaptureFixture[str]) -> None:
    """``--pp x`` exits with status 2 naming --pp."""
    code = cli_main(["deploy", "scenarios/quickstart.yaml", "--load", "1", "--slo", "ttft_p99=1", "--gpus", "H100", "--pp", "x"])
    assert code == 2
    assert "--pp: 'x' is not allowed" in capsys.readouterr().err
