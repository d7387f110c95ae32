"""Settings that used to pass loading and fail later (mid-run, or by exhausting memory) are
refused when the scenario is loaded, at their key path; errors raised in a worker process
reach the caller whole."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from simpy_llm.cli import main
from simpy_llm.config import ScenarioError
from simpy_llm.config.validators import MAX_DRAFT_DEVICES
from simpy_llm.loading import load_scenario
from simpy_llm.serving.batching import SampledServiceTimes
from simpy_llm.workload.distributions import Constant

MULTI_BIN = "scenarios/multi_bin_only.yaml"
MOBILE = "scenarios/speculative_mobile_cloud.yaml"
DISTRIBUTION = "serving.batch_server.service.params.distribution"


@pytest.mark.parametrize("value", [5, 2.5, "uniform", [1, 2], None, True])
def test_a_sampled_service_distribution_of_any_other_shape_is_refused(value: Any) -> None:
    """The sampled service's distribution is a length distribution whatever its shape: a number,
    a string, a list or null is refused at its key path (it used to load and crash the run with
    an AttributeError)."""
    with pytest.raises(ScenarioError) as err:
        load_scenario(MULTI_BIN, {DISTRIBUTION: value})
    assert err.value.paths == [DISTRIBUTION]
    assert f"must be a length distribution {{type: NAME, params: {{...}}}} (of seconds), got {value!r}" in str(err.value)


def test_validate_and_run_refuse_a_number_as_the_service_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    """The reproduction on the command line: validate and run both exit 2 with the message."""
    assert main(["validate", MULTI_BIN, "--set", f"{DISTRIBUTION}=5"]) == 2
    assert main(["run", MULTI_BIN, "--set", f"{DISTRIBUTION}=5", "--set", "workload.num_requests=40", "--progress", "off"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count(f"{DISTRIBUTION}: must be a length distribution") == 2 and "Traceback" not in err


def test_a_sampled_service_takes_a_distribution_object() -> None:
    """In Python a distribution object is taken as it is (anything with sample and mean)."""
    assert SampledServiceTimes(distribution=Constant(value=2.0)).mean_s == 2.0


def test_draft_devices_are_bounded_per_group_and_in_all() -> None:
    """A draft group of more than MAX_DRAFT_DEVICES devices, or groups adding up to more, are
    refused (a 4-million-device group used to take the memory of the machine while building)."""
    with pytest.raises(ScenarioError) as err:
        load_scenario(MOBILE, {"speculation.drafts.0.count": MAX_DRAFT_DEVICES + 1})
    assert err.value.paths == ["speculation.drafts[0].count"] and f"must be <= {MAX_DRAFT_DEVICES}" in str(err.value)
    half = MAX_DRAFT_DEVICES // 2
    with pytest.raises(ScenarioError) as err:
        load_scenario(MOBILE, {"speculation.drafts.0.count": half + 1, "speculation.drafts.1.count": half})
    assert err.value.paths == ["speculation.drafts"] and f"{MAX_DRAFT_DEVICES + 1} draft devices over all groups" in str(err.value)


def test_a_scenario_error_survives_pickling() -> None:
    """A ScenarioError is rebuilt from its source, problems and kind (it used to fail to
    unpickle, so a worker's error could not reach a sweep)."""
    error = ScenarioError("w.yaml", [("clients[0].id", "must not be empty")], "workload spec")
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), copy.source, copy.problems, copy.what, str(copy)) == (
        ScenarioError, "w.yaml", [("clients[0].id", "must not be empty")], "workload spec", str(error)
    )
