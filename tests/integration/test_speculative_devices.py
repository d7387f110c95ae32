"""Draft devices' profiles in speculative decoding: availability, throttling, speed from
memory bandwidth, and the KV guard's spill to fused; plus the run's outputs (manifest,
γ timeline, the CLI's rows)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.cli import main
from simpy_llm.serving.devices import device_profile, device_profile_to_dict
from tests.spec_helpers import flat_curve, spec_scenario

BETA0_S, BETA2_S = 5e-3, 200e-6


def _run(data):
    return Simulation(scenario_from_dict(data)).run(progress=False)


def _phone(tmp_path: Path, **changes) -> str:
    """The shipped phone profile with *changes*, as a file."""
    data = device_profile_to_dict(device_profile("phone-snapdragon-8-gen-3"))
    data.update(changes)
    data["id"] = "test-phone"
    path = tmp_path / "phone.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_a_device_out_of_service_starts_nothing_until_it_is_back(tmp_path):
    """A device whose profile is out of service during [0, 5) s starts its requests at 5 s
    at the earliest (its prompt goes up then), whatever their arrival."""
    curve = flat_curve(tmp_path, [0.6] * 4)
    device = _phone(tmp_path, availability=[{"start_s": 0.0, "end_s": 5.0}])
    data = spec_scenario(curve, requests=6, rate=10.0, output=20, devices=2, group={"device": device})
    f = _run(data).to_dataframe()
    assert (f["arrival_s"] - f["upload_s"] >= 5.0).all()
    assert (f["status"] == "completed").all()


def test_a_throttled_device_drafts_slower_after_its_busy_spell(tmp_path):
    """A device busy longer than its profile's ``throttle_after_s`` drafts at
    ``throttle_factor`` of its speed: with every draft accepted and expected acceptance, a
    round takes γ d + v before and γ d / factor + v after (v = beta0 + 5 beta2)."""
    gamma, d_ms = 4, 20.0
    curve = flat_curve(tmp_path, [1.0] * 4)
    device = _phone(tmp_path, thermal={"throttle_after_s": 3.0, "throttle_factor": 0.5})
    data = spec_scenario(
        curve, requests=1, rate=1.0, output=401, devices=1, draft_token_ms=d_ms, group={"device": device},
        speculation={"gamma_policy": {"kind": "static", "params": {"gamma": gamma}}},
    )
    results = _run(data)
    rounds = results.spec_rounds()
    start = results.to_dataframe()["arrival_s"].iloc[0]
    gaps = np.diff(rounds["time_s"].to_numpy())
    v = BETA0_S + BETA2_S * (gamma + 1)
    before = gaps[rounds["time_s"].to_numpy()[1:] - start < 2.9]
    after = gaps[rounds["time_s"].to_numpy()[:-1] - start > 3.2][:-1]  # the last round is capped
    assert len(before) > 10 and len(after) > 10
    assert np.allclose(before, gamma * d_ms / 1e3 + v, atol=1e-9)
    assert np.allclose(after, gamma * d_ms / 1e3 / 0.5 + v, atol=1e-9)


def test_weights_gb_drafts_at_the_devices_memory_bandwidth(tmp_path):
    """A drafter given by ``weights_gb`` on a 76.8 GB/s phone drafts a token in
    weights_gb / 76.8 s: 0.768 GB gives 10 ms, so isolated rounds take 4 x 10 ms + v."""
    gamma = 4
    curve = flat_curve(tmp_path, [1.0] * 4)
    data = spec_scenario(
        curve, requests=1, rate=1.0, output=101, devices=1,
        group={"device": "phone-snapdragon-8-gen-3",
               "drafters": [{"name": "w", "acceptance": curve, "weights_gb": 0.768}]},
        speculation={"gamma_policy": {"kind": "static", "params": {"gamma": gamma}}},
    )
    rounds = _run(data).spec_rounds()
    gaps = np.diff(rounds["time_s"].to_numpy())[:-1]
    assert np.allclose(gaps, gamma * 0.010 + BETA0_S + BETA2_S * (gamma + 1), atol=1e-9)


def test_kv_spill_fused_runs_requests_admitted_past_the_guard_fused(tmp_path):
    """With ``kv_spill: fused`` a request whose admission pushes KV use past
    ``max_kv_utilization`` runs fused; those admitted within it run distributed."""
    curve = flat_curve(tmp_path, [0.7] * 4)
    engine = {"max_num_seqs": 64, "max_num_batched_tokens": 512, "kv_block_size": 16, "kv_num_blocks": 64}
    data = spec_scenario(
        curve, requests=8, rate=1e6, prompt=128, output=128, devices=8, engine=engine,
        speculation={"verify": {"max_kv_utilization": 0.3, "kv_spill": "fused"},
                     "fused": {"draft_token_ms": 1.0, "acceptance": curve}},
    )
    f = _run(data).to_dataframe().sort_values("first_scheduled_s")
    # 1,024 tokens of KV, 256 per request: the first fits the 30 % guard (307 tokens), the
    # next three only the whole cache; the rest wait for KV and then follow the same rule.
    assert f["spec_mode"].iloc[0] == "distributed"
    assert (f["spec_mode"].iloc[1:4] == "fused").all()
    assert (f["status"] == "completed").all()


def test_the_manifest_pins_the_acceptance_curve_file(tmp_path):
    """``Results.save`` writes the SHA-256 of the curve file the scenario names, so a changed
    curve shows in the manifest under the same name."""
    curve = flat_curve(tmp_path, [0.6] * 4)
    results = _run(spec_scenario(curve, requests=5, output=10))
    out = results.save(tmp_path / "run")
    inputs = json.loads((out / "manifest.json").read_text())["inputs"]
    entry = inputs["speculation.drafts[0].drafters[0].acceptance"]
    import hashlib

    assert entry["sha256"] == hashlib.sha256(Path(curve).read_bytes()).hexdigest()
    assert (out / "spec_rounds.csv").is_file()


def test_the_gamma_timeline_counts_every_round(tmp_path):
    """``gamma_timeline`` bins every round once, and a static γ's bins average that γ (but
    for rounds capped at the end of an answer)."""
    curve = flat_curve(tmp_path, [0.6] * 4)
    data = spec_scenario(curve, requests=40, rate=5.0, output=200,
                         speculation={"gamma_policy": {"kind": "static", "params": {"gamma": 3}}})
    results = _run(data)
    timeline = results.gamma_timeline(1.0)
    assert timeline["rounds"].sum() == len(results.spec_rounds())
    assert (timeline["mean_gamma"] <= 3).all() and timeline["mean_gamma"].median() > 2.9
    with pytest.raises(ValueError, match="bin_s"):
        results.gamma_timeline(0.0)


def test_the_cli_shows_the_speculation_rows(tmp_path, capsys):
    """``simpy-llm run`` on a speculative scenario prints its rounds, acceptance and TVT."""
    curve = flat_curve(tmp_path, [0.6] * 4)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec_scenario(curve, requests=10, output=20)))
    assert main(["run", str(path)]) == 0
    out = capsys.readouterr().out
    assert "speculation" in out and "rounds" in out and "TVT (ms)" in out


def test_a_drafter_can_use_a_trained_regressor_bundle(tmp_path):
    """A ``.joblib`` regressor bundle trained on a log of a constant p = 0.8 chain stands in
    for a curve file: a scenario names it, and the rounds' mean tokens at γ = 3 come within
    3 % of 1 + 0.8 + 0.8^2 + 0.8^3 (the forest's error on ~60k rows is well under 1 %)."""
    pytest.importorskip("sklearn", reason="needs the learn extra (scikit-learn): pip install -e '.[learn]'")
    import pandas as pd

    from simpy_llm.speculative.regressor import train_acceptance_regressor

    rng = np.random.default_rng(0)
    rows = []
    for context in rng.choice([128, 512, 2048], size=20_000):
        for position in range(1, 5):
            ok = int(rng.random() < 0.8)
            rows.append((int(context), position, 0.0, ok))
            if not ok:
                break
    log = pd.DataFrame(rows, columns=["context_len", "position", "temperature", "accepted"])
    model = train_acceptance_regressor(log, name="flat-rf", drafter="d", verifier="v", source="synthetic log",
                                       n_estimators=20)
    bundle = tmp_path / "flat-rf.joblib"
    model.save(bundle)
    data = spec_scenario(str(bundle), requests=150, rate=20.0, output=120, devices=15,
                         speculation={"gamma_policy": {"kind": "static", "params": {"gamma": 3}}})
    rounds = _run(data).spec_rounds()
    full = rounds[rounds["gamma"] == 3]
    assert len(full) > 3000
    assert float((full["accepted"] + 1).mean()) == pytest.approx(1 + 0.8 + 0.64 + 0.512, rel=0.03)
