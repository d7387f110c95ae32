"""Calibrated profiles standing in for catalogue rows in the deployment search (deploy(...,
profiles=...), --profile NAME=FILE --profile-gpu NAME=GPU[:TP]): the fitted latency model is
what runs, priced as the GPU named, and bad profiles are refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from simpy_llm.explore.capacity import StabilityCriteria, min_replicas
from simpy_llm.explore.deploy import deploy
from simpy_llm.serving.catalogue import gpu_prices

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "llamacpp_cpu.yaml"
FITTED = ROOT / "profiles" / "fitted" / "llamacpp-gemma3-270m-q4km-cpu1.yaml"
"""The profile fitted on a recorded llama.cpp trace (profiles/fitted), which the scenario runs."""

CRITERIA = StabilityCriteria(slo={"ttft_p99": 5.0}, max_backlog_growth=0.05)
WINDOW: dict[str, Any] = {"warmup_requests": 20, "measure_requests": 100}


@pytest.fixture(scope="module")
def result() -> Any:
    return deploy(SCENARIO, load=0.6, slo=CRITERIA, gpus=["H100"], max_replicas=16, exhaustive=True, **WINDOW,
                  profiles={"gemma-l40s": {"file": str(FITTED), "gpu": "L40S"},
                            "gemma-a100x2": {"file": str(FITTED), "gpu": "A100-80", "tp": 2}})


def test_a_profile_row_finds_the_replicas_of_its_fitted_model(result: Any) -> None:
    """A profile's row needs the replicas min_replicas finds for the scenario running that
    profile (here the scenario's own latency model and its llama.cpp engine, which the search
    leaves as they are: no engine setting was given): 4 at 0.6 conversations/s."""
    card = min_replicas(SCENARIO, load=0.6, criteria=CRITERIA, **WINDOW)
    assert card.min_replicas == 4
    assert [o.min_replicas for o in result.outcomes] == [4, 4]


def test_a_profile_row_is_priced_as_its_gpu(result: Any) -> None:
    """A profile's row costs replicas x TP x the price of the GPU it names: 4 x 1 x 1.9512 on
    L40S, the answer, and 4 x 2 x 2.4984 on two A100-80s."""
    prices = gpu_prices()
    assert (prices["L40S"], prices["A100-80"]) == (1.9512, 2.4984)
    l40s, a100 = result.outcomes
    assert (l40s.status, l40s.cost_per_hour) == ("cheapest", 4 * 1 * 1.9512)
    assert (a100.status, a100.cost_per_hour) == ("costlier", 4 * 2 * 2.4984)
    assert l40s.configuration.label().startswith("profile gemma-l40s on L40S tp1 ")
    row = result.to_dict()["best"]
    assert (row["profile"], row["profile_file"], row["gpu"]) == ("gemma-l40s", str(FITTED), "L40S")


def test_engine_settings_given_apply_to_a_profile_row() -> None:
    """An engine setting the space gives is set on a profile's row too: the llama.cpp engine
    refuses max_num_seqs, so the row is refused with the scenario's message."""
    result = deploy(SCENARIO, load=0.6, slo=CRITERIA, gpus=["H100"], max_num_seqs=[8], **WINDOW,
                    profiles={"gemma": {"file": str(FITTED), "gpu": "L40S"}})
    (only,) = result.outcomes
    assert only.status == "refused" and "serving.engine.max_num_seqs: unknown key" in only.reason


@pytest.mark.parametrize(
    ("profiles", "message"),
    [
        ({"p": {"file": "missing.yaml", "gpu": "L40S"}}, "profiles['p'].file: missing.yaml is not a profile: cannot read profile: No such file"),
        ({"p": {"file": str(FITTED), "gpu": "B200"}}, "profiles['p'].gpu: unknown GPU 'B200'"),
        ({"p": {"file": str(FITTED), "gpu": "L40S", "tp": 0}}, "profiles['p'].tp must be an integer >= 1, got 0"),
        ({"p": {"file": str(FITTED)}}, "profiles['p'] must be {file: FILE, gpu: GPU} and optionally tp: N"),
    ],
)
def test_bad_profiles_are_refused(profiles: dict[str, Any], message: str) -> None:
    """A profile that cannot be read, an unknown GPU, a TP below 1 and a missing GPU are refused
    before any simulation, naming the profile and the key."""
    with pytest.raises(ValueError) as info:
        deploy(SCENARIO, load=0.6, slo=CRITERIA, gpus=["H100"], profiles=profiles, **WINDOW)
    assert message in str(info.value)


def test_command_takes_a_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """simpy-llm deploy --profile NAME=FILE --profile-gpu NAME=GPU:TP searches the profile's row;
    a profile without its GPU exits with status 2 and says so."""
    from simpy_llm.cli import main

    base = ["deploy", str(SCENARIO), "--load", "0.6", "--slo", "ttft_p99=5", "--gpus", "H100", "--warmup-requests", "20",
            "--measure-requests", "1000", "--max-replicas", "8", "--executor", "serial", "--quiet"]
    assert main([*base, "--profile", f"gemma={FITTED}", "--profile-gpu", "gemma=A100-80:2"]) == 0
    assert "| 0 | profile gemma on A100-80 tp2 " in capsys.readouterr().out
    assert main([*base, "--profile", f"gemma={FITTED}"]) == 2
    assert "profile 'gemma': give both --profile gemma=FILE and --profile-gpu gemma=GPU[:TP]" in capsys.readouterr().err
