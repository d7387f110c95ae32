"""The deployment search with speculative decoding on and off (deploy(..., speculation=[True,
False]), --speculation on,off): both arms searched and reported, the draft devices' price
on the "on" arm, and a search asking for speculation the scenario lacks refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from simpy_llm.explore.capacity import StabilityCriteria
from simpy_llm.explore.deploy import deploy
from tests.spec_helpers import spec_scenario

MODEL = "llama-3.1-8b-instruct"
JETSON = Path(__file__).resolve().parents[2] / "profiles" / "devices" / "jetson-agx-orin.yaml"


def _search(scenario: dict[str, Any], tpot_s: float, load: float, **kwargs: Any) -> Any:
    return deploy(scenario, load=load, slo=StabilityCriteria(slo={"tpot_p99": tpot_s}, max_backlog_growth=0.05),
                  gpus=["H100", "A100-80"], tp=[1], model=MODEL, warmup_requests=50, measure_requests=150,
                  max_replicas=8, speculation=[True, False], **kwargs)


def _fused() -> dict[str, Any]:
    """500-token prompts, 100-token answers; the target drafts for itself at 1 ms a token."""
    return spec_scenario("illustrative-mobile", requests=200, prompt=500, output=100, speculation={
        "mode": "fused", "fused": {"draft_token_ms": 1.0, "acceptance": "illustrative-mobile"}})


def _priced_drafts(tmp_path: Path) -> dict[str, Any]:
    """The same requests drafted on four rented edge devices at 0.5 USD/h each, 1 ms a token."""
    device = tmp_path / "rented-edge.yaml"
    device.write_text(JETSON.read_text().replace("id: jetson-agx-orin", "id: rented-edge") + "price_per_hour_usd: 0.5\n")
    return spec_scenario("illustrative-mobile", requests=200, prompt=500, output=100, devices=4, draft_token_ms=1.0,
                         group={"device": str(device)})


@pytest.fixture(scope="module")
def fused() -> Any:
    return _search(_fused(), tpot_s=0.02, load=8.0, exhaustive=True)


def test_speculation_wins_where_it_meets_the_tpot_target(fused: Any) -> None:
    """Fused speculation brings one A100-80's p99 TPOT under 20 ms, which no count of A100-80s
    without it meets: the answer is the "on" arm, at one A100-80's price (a fused draft runs
    on the target's GPU and costs nothing more)."""
    best = fused.best
    assert best is not None
    c = best.configuration
    assert (c.gpu, c.speculation, c.draft_cost_per_hour, best.min_replicas, best.cost_per_hour) == (
        "A100-80", True, 0.0, 1, 2.4984)
    off = next(o for o in fused.outcomes if o.configuration.gpu == "A100-80" and o.configuration.speculation is False)
    assert off.status == "misses_slo" and "tpot_p99" in off.reason


def test_both_arms_are_searched_and_reported(fused: Any, tmp_path: Path) -> None:
    """Each catalogue row is searched with and without speculation, and the outputs say which
    arm each row is and what its drafts cost."""
    arms = [(o.configuration.gpu, o.configuration.speculation) for o in fused.outcomes]
    assert arms == [("A100-80", True), ("A100-80", False), ("H100", True), ("H100", False)]
    assert all(o.simulations > 0 for o in fused.outcomes)
    fused.save(tmp_path)
    data = json.loads((tmp_path / "deploy.json").read_text())
    assert data["speculation"] is True
    assert [(r["speculation"], r["draft_cost_per_hour"]) for r in data["configurations"]] == [
        (True, 0.0), (False, 0.0), (True, 0.0), (False, 0.0)]
    assert {"speculation", "draft_cost_per_hour"} <= set((tmp_path / "deploy.csv").read_text().splitlines()[0].split(","))
    text = (tmp_path / "deploy.md").read_text()
    assert "**answer**: 1 x A100-80 tp1 fcfs seqs=64 tokens=4096 chunked speculative = 2.498 USD/h" in text
    assert "| 1 | A100-80 tp1 fcfs seqs=64 tokens=4096 chunked no-speculation | misses_slo |" in text


def test_priced_draft_devices_add_to_the_on_arm(tmp_path: Path) -> None:
    """Draft devices whose profile has a price cost it on the "on" arm, whatever the replica
    count: one A100-80 with four 0.5 USD/h drafters costs 2.4984 + 4 x 0.5 = 4.4984 USD/h,
    so the same A100-80 without speculation (2.4984) is the answer."""
    result = _search(_priced_drafts(tmp_path), tpot_s=0.05, load=4.0, exhaustive=True)
    on, off = result.outcomes[0], result.outcomes[1]
    assert on.configuration.draft_cost_per_hour == 4 * 0.5
    assert (on.min_replicas, on.cost_per_hour, on.status) == (1, 1 * 1 * 2.4984 + 4 * 0.5, "costlier")
    assert on.cost_per_hour == pytest.approx(4.4984, abs=1e-12)
    assert (off.min_replicas, off.cost_per_hour, off.status) == (1, 2.4984, "cheapest")
    h100_on = result.outcomes[2]
    assert h100_on.cost_per_hour == pytest.approx(3.9492 + 2.0, abs=1e-12)


@pytest.mark.parametrize(
    ("speculation", "message"),
    [
        ([True, False], "speculation: True (on) runs the scenario's speculation block, and the scenario has none"),
        (["on"], "speculation: 'on' is not allowed; allowed: True, False"),
    ],
)
def test_speculation_the_scenario_lacks_is_refused(speculation: list[Any], message: str) -> None:
    """Asking for the "on" arm of a scenario without a speculation block, or an arm that is not
    True or False, is refused before any simulation."""
    scenario = _fused()
    del scenario["speculation"]
    with pytest.raises(ValueError) as info:
        deploy(scenario, load=4.0, slo={"tpot_p99": 0.05}, gpus=["A100-80"], tp=[1], model=MODEL, speculation=speculation)
    assert message in str(info.value)
