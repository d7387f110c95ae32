"""The verify-server keys ``speculation.verify.prefix_caching`` and
``speculation.verify.preemption_slack_ms``: defaults, accepted values, and the problem
reported (at its key path) for a bad one."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from simpy_llm import scenario_from_dict
from simpy_llm.config.errors import ScenarioError
from simpy_llm.config.speculation import VerifyConfig
from tests.spec_helpers import flat_curve, spec_scenario


def scenario(tmp_path: Path, **verify: Any) -> dict[str, Any]:
    data = spec_scenario(flat_curve(tmp_path, [0.8, 0.7, 0.6, 0.5]), speculation={"verify": verify})
    data["slo"] = {"default": {"tvt_s": 0.1}}  # rounds have deadlines, so a preemption threshold applies
    return data


def problem(data: dict[str, Any]) -> tuple[str, str]:
    """The one problem loading *data* reports: (key path, message)."""
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data, source="s.yaml")
    assert len(info.value.problems) == 1, info.value.problems
    path, message = info.value.problems[0]
    return path, message


def test_both_are_off_by_default():
    """A verify section that gives neither key: no prefix cache, passes never cut."""
    config = VerifyConfig()
    assert config.prefix_caching is False and config.preemption_slack_ms is None


def test_accepted_values_load(tmp_path):
    """``prefix_caching: true`` and any finite threshold, negative included (cut only for a
    job already that late), load as given."""
    for slack in (-5.0, 0.0, 12.5):
        spec = scenario_from_dict(scenario(tmp_path, prefix_caching=True, preemption_slack_ms=slack)).speculation
        assert spec is not None and spec.verify.prefix_caching is True and spec.verify.preemption_slack_ms == slack


def test_prefix_caching_must_be_a_boolean(tmp_path):
    """A string for ``prefix_caching`` is refused at its key path."""
    path, _message = problem(scenario(tmp_path, prefix_caching="sometimes"))
    assert path == "speculation.verify.prefix_caching"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1e15, "soon"])
def test_preemption_slack_ms_must_be_a_finite_number_of_ms(tmp_path, bad):
    """A threshold that is not a finite number of milliseconds within the time bound is
    refused at its key path, the message saying what is allowed."""
    path, message = problem(scenario(tmp_path, preemption_slack_ms=bad))
    assert path == "speculation.verify.preemption_slack_ms"
    assert re.search(r"finite|must be in|number|float", message), message


def test_a_preemption_threshold_without_any_round_deadline_is_refused(tmp_path):
    """With no SLO class setting tvt_s or tpot_s no round has a deadline, so the threshold
    could never cut a pass: it is refused at its key path, not accepted and left idle."""
    from simpy_llm import scenario_from_dict
    from simpy_llm.config.errors import ScenarioError
    from tests.spec_helpers import flat_curve, spec_scenario

    data = spec_scenario(flat_curve(tmp_path, [0.7] * 4), speculation={"verify": {"preemption_slack_ms": 5.0}})
    data["slo"] = {"default": {"ttft_s": 1.0}}
    with pytest.raises(ScenarioError, match=r"speculation\.verify\.preemption_slack_ms: no SLO class sets tvt_s or tpot_s"):
        scenario_from_dict(data)
