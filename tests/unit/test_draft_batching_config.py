"""The keys of draft-side batching (a draft group's ``max_batch`` and ``max_wait_ms``, a
drafter's ``latency_model``): their defaults, and each mistake refused at its key path."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from simpy_llm import scenario_from_dict
from simpy_llm.config.errors import ScenarioError
from simpy_llm.config.plain import scenario_to_dict
from simpy_llm.serving.latency import BlisLinearLatency
from simpy_llm.speculative.draft import Drafter
from tests.spec_helpers import flat_curve, spec_scenario

BLIS = {"kind": "blis_linear", "params": {"beta0_us": 3000.0, "beta2_us": 500.0}}


@pytest.fixture
def curve(tmp_path: Path) -> str:
    return flat_curve(tmp_path, [0.8, 0.7, 0.6, 0.5])


def problem(data: dict[str, Any]) -> tuple[str, str]:
    """The one problem loading *data* raises: (key path, message)."""
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data, source="s.yaml")
    assert len(info.value.problems) == 1, info.value.problems
    return info.value.problems[0]


def test_batching_is_off_by_default(curve):
    """A draft group without the keys runs one request at a time and never waits."""
    group = scenario_from_dict(spec_scenario(curve)).speculation.drafts[0]
    assert (group.max_batch, group.max_wait_ms) == (1, 0.0)
    assert group.drafters[0].latency_model is None


@pytest.mark.parametrize(
    ("group", "path", "words"),
    [
        ({"max_batch": 0}, "speculation.drafts[0].max_batch", r"must be >= 1, got 0"),
        ({"max_batch": 2.5}, "speculation.drafts[0].max_batch", r"must be an integer"),
        ({"max_batch": 100_001}, "speculation.drafts[0].max_batch", r"must be <= 100000"),
        ({"max_batch": 4, "max_wait_ms": -1.0}, "speculation.drafts[0].max_wait_ms", r"must be >= 0"),
        ({"max_wait_ms": 5.0}, "speculation.drafts[0].max_wait_ms", r"applies only with max_batch > 1"),
    ],
    ids=["zero batch", "fractional batch", "huge batch", "negative wait", "wait without batching"],
)
def test_a_bad_batching_key_is_refused_at_its_path(curve, group, path, words):
    """Each bad ``max_batch`` or ``max_wait_ms`` is one problem at its own key path, saying
    what is allowed."""
    where, message = problem(spec_scenario(curve, group=group))
    assert where == path
    assert re.search(words, message), message


@pytest.mark.parametrize(
    ("drafter", "path", "words"),
    [
        ({"draft_token_ms": 1.0, "latency_model": BLIS}, "latency_model", r"instead of draft_token_ms and weights_gb"),
        ({"latency_model": {"kind": "nope"}}, "latency_model.kind", r"unknown latency model 'nope'; one of: .*blis_linear"),
        ({"latency_model": {"kind": "blis_linear", "params": {"beta0_us": -1.0}}}, "latency_model.params.beta0_us", r"must be >= 0"),
        ({"latency_model": {"kind": "blis_linear", "params": {"beta0_us": 1.0, "rng": 1}}}, "latency_model.params.rng",
         r"set by the simulation"),
    ],
    ids=["with draft_token_ms", "unknown kind", "bad parameter", "rng given"],
)
def test_a_bad_drafter_latency_model_is_refused_at_its_path(curve, drafter, path, words):
    """A drafter's ``latency_model`` is checked as a replica group's, and excludes the other
    two ways of giving its speed."""
    data = spec_scenario(curve, group={"drafters": [{"name": "d", "acceptance": curve, **drafter}]})
    where, message = problem(data)
    assert where == f"speculation.drafts[0].drafters[0].{path}"
    assert re.search(words, message), message


def test_the_keys_survive_a_round_trip_through_plain_data(curve):
    """A scenario with batching and a drafter latency model, written out as plain data and
    loaded again, is the same scenario."""
    group = {"max_batch": 6, "max_wait_ms": 2.5, "drafters": [{"name": "d", "acceptance": curve, "latency_model": BLIS}]}
    scenario = scenario_from_dict(spec_scenario(curve, group=group))
    again = scenario_from_dict(scenario_to_dict(scenario))
    assert again.speculation == scenario.speculation
    assert again.speculation.drafts[0].max_batch == 6
    assert scenario.replace(**{"speculation.drafts.0.max_batch": 3}).speculation.drafts[0].max_batch == 3


def test_a_drafters_token_time_is_its_latency_models_step_of_one():
    """With a latency model, a drafter's time per token (what a device drafting alone and the
    γ policies read) is the model's decode step of one token, and a step of n is its step of
    n decode tokens: ``beta0 + n beta2``."""
    drafter = Drafter("d", 1.0, None, BlisLinearLatency(beta0_us=3000.0, beta2_us=500.0))
    assert drafter.draft_token_s == pytest.approx(3.5e-3, abs=1e-15)
    assert [round(drafter.step_s(n), 12) for n in (1, 2, 8)] == [3.5e-3, 4e-3, 7e-3]
