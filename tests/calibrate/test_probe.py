"""``simpy-llm calibrate probe``: the designed measurement and what it estimates.

Three kinds of test:

* **Estimation, exactly.** A trace shaped as the probe sends (its phases named in ``client_id``)
  made by the simulator itself (:func:`simulated_observation`, every token at its simulated
  time) with a ``batch_table`` model of known coefficients: :func:`probe_estimate` must give back
  every coefficient. The only error left is the trace's whole microseconds.
* **Live, against the emulated server** (the truth test): the probe runs over HTTP against an
  in-process :class:`EmulatedServer` whose latency model is known; every estimate must fall
  within its interval of the truth, widened by what the emulator's timing error can explain,
  which the test measures request by request (module docstring of that test).
* The command line, the design's budget, prompts of exact length and the documented fallbacks.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.calibrate import simulated_observation
from simpy_llm.calibrate.probe import (
    DEFAULT_MAX_SECONDS,
    _Prompts,
    plan_design,
    run_probe_async,
)
from simpy_llm.calibrate.probe_estimate import (
    COEFFICIENTS,
    ProbeError,
    median_interval,
    probe_estimate,
    write_probe_profile,
)
from simpy_llm.cli import main
from simpy_llm.loading import load_scenario
from simpy_llm.observe.client import OpenAIClient
from simpy_llm.observe.emulate import EmulatedServer
from simpy_llm.serving.batch_table import BatchTableLatency
from simpy_llm.workload.traces import read_trace_v2, write_trace_v2
from tests.observe.serve_process import serve_process

TRUTH: dict[str, Any] = {
    "decode_step_us": [20000.0, 32000.0, 41000.0],
    "prefill_step_us": 9000.0,
    "prefill_only_step_us": 6000.0,
    "prefill_token_us": 300.0,
    "prefill_pair_us": 0.2,
    "alpha0_us": 15000.0,
    "decode_context_us": 12.0,
    "cache_restore_us": 70000.0,
}
"""Known coefficients of the simulated server (µs): every term is visible in the probe's phases."""


def _engine(cache_prompt: bool = True, preset: bool = True) -> dict[str, Any]:
    if preset:
        return {"preset": "llamacpp", "n_parallel": 3, "ctx_per_slot": 1024, "cache_prompt": cache_prompt}
    return {"max_num_seqs": 3, "max_num_batched_tokens": 2048, "kv_block_size": 1, "kv_num_blocks": 20000,
            "max_model_len": 1024, "prefix_caching": cache_prompt}


def _probe_rows() -> tuple[list[dict[str, Any]], dict[str, int]]:
    """A probe's requests as a workload: each phase on an idle server, its requests where the probe
    would send them (the mixed phase's prompts join while the decoder is running alone)."""
    rows: list[dict[str, Any]] = []
    t = 1.0

    def add(phase: str, at: float, prompt: int, output: int, group: str = "") -> None:
        rows.append({"request_id": len(rows), "client_id": phase, "arrival_time_us": round(at * 1e6),
                     "input_tokens": prompt, "output_tokens": output, "prefix_group": group, "streaming": True})

    for _ in range(2):
        for length in (4, 32, 61, 118, 226, 434, 834):
            add("isolated", t, length, 2)
            t += 2.0
    for n in (1, 2, 3):
        for _ in range(n):
            add(f"decode.{n}", t, 8, 30)
        t += 3.0
    add("mixed.decoder", t, 16, 250)
    for i, length in enumerate((40, 100, 180, 300)):
        add("mixed.joiner", t + 0.3 + i, length, 1)
    t += 8.0
    for name in ("extension", "restore"):
        for rep in range(2):
            group = f"{name}{rep}"
            add(f"{name}.base", t, 200, 1, group)
            if name == "restore":  # every slot taken by another prompt: the base's context goes to host memory
                for _ in range(3):
                    add("restore.fill", t + 1.0, 100, 2)
                t += 1.0
            add(name, t + 1.0, 260, 1, group)
            t += 2.0
    return rows, {f"{name}{rep}": 200 for name in ("extension", "restore") for rep in range(2)}


def _simulated_probe(tmp: Path, truth: dict[str, Any] = TRUTH, *, preset: bool = True, keep=None) -> Path:
    """The probe's requests served by the simulator with *truth*, as an observed trace."""
    rows, groups = _probe_rows()
    if keep is not None:
        rows = [r for r in rows if keep(r["client_id"])]
    write_trace_v2(pd.DataFrame(rows), tmp / "workload", header={"mode": "generated", "prefix_groups": groups})
    scenario = scenario_from_dict({
        "name": "probe-truth", "seed": 1,
        "workload": {"traces": [{"path": str(tmp / "workload.csv"), "format": "trace_v2"}]},
        "serving": {"engine": _engine(preset=preset), "latency_model": {"kind": "batch_table", "params": truth}},
    })
    simulated_observation(scenario, tmp / "probe" / "trace")
    return tmp / "probe"


# ----------------------------------------------------------------------------- estimation, exactly


def test_probe_estimate_recovers_every_coefficient_of_a_simulated_probe(tmp_path):
    """On a probe trace the simulator made with known coefficients, every ``batch_table``
    coefficient comes back to within the trace's microsecond rounding (1e-4 relative; the pair
    term, 1e-3), each from its phase, and each interval covers the truth to the same tolerance."""
    result = probe_estimate(_simulated_probe(tmp_path))
    assert result.sources == {k: (["probe"] * 3 if k == "decode_step_us" else "probe") for k in COEFFICIENTS}
    assert result.params["decode_step_us"] == pytest.approx(TRUTH["decode_step_us"], rel=1e-4)
    for name in COEFFICIENTS[1:]:
        tol = 1e-3 if name == "prefill_pair_us" else 1e-4
        assert result.params[name] == pytest.approx(TRUTH[name], rel=tol), name
        low, high = result.intervals[name]
        assert low * (1 - tol) <= TRUTH[name] <= high * (1 + tol), (name, low, high)
    for (low, high), truth in zip(result.intervals["decode_step_us"], TRUTH["decode_step_us"], strict=True):
        assert low - 2 <= truth <= high + 2  # whole microseconds at either end of a gap
    # A prefix still in its slot starts at no extra cost; one restored from host memory costs
    # the restore. Both find the shared prefix less 5 tokens (docs/model.md, "Checkpoints taken").
    cached = result.statistics["cached_prefix_us"]
    assert cached["extension"]["value"] == pytest.approx(0.0, abs=1.0)
    assert cached["restore"]["value"] == pytest.approx(70000.0, rel=1e-4)
    assert result.statistics["extension"]["cached_tokens"] == [195, 195]
    assert result.statistics["restore"]["cached_tokens"] == [195, 195]
    assert cached["cache_restore_from"] == "restore"
    assert result.warnings == []


def test_probe_ranges_say_what_the_probe_covered(tmp_path):
    """``fit.ranges``: prompt and uncached prompt tokens, outputs, decoders and requests in
    flight, and the cached fraction, each [min, max] over the probe's requests (hand-counted
    from the design of :func:`_probe_rows`)."""
    result = probe_estimate(_simulated_probe(tmp_path))
    assert result.ranges == {
        "prompt_tokens": [4, 834],
        "uncached_prompt_tokens": [4, 834],  # the extensions computed 260 - 195 = 65 (a checkpoint 5 tokens back)
        "output_tokens": [1, 250],
        "decoders": [1, 3],
        "concurrency": [1, 3],  # decode.3
        "cached_fraction": [0.0, 195 / 260],
    }


def test_probe_profile_loads_as_a_latency_model(tmp_path):
    """``profile.yaml`` is a profile: a scenario naming it (``latency_model: {profile: FILE}``)
    gets the probed coefficients, and its ``fit`` block follows the contract."""
    result = probe_estimate(_simulated_probe(tmp_path))
    path = write_probe_profile(result, tmp_path / "profile.yaml")
    data = yaml.safe_load(path.read_text())
    assert data["profile_version"] == 1 and data["fit"]["method"] == "probe"
    assert set(data["fit"]["intervals"]) == set(COEFFICIENTS) == set(data["fit"]["sources"])
    assert set(data["fit"]["ranges"]) == {"prompt_tokens", "uncached_prompt_tokens", "output_tokens", "decoders",
                                          "concurrency", "cached_fraction"}
    scenario_file = tmp_path / "s.yaml"
    scenario_file.write_text(yaml.safe_dump({
        "workload": {"aggregate_rate": 1.0, "num_requests": 3, "clients": [{
            "id": "a", "arrival": {"process": "poisson"},
            "input_distribution": {"type": "constant", "params": {"value": 50}},
            "output_distribution": {"type": "constant", "params": {"value": 5}}}]},
        "serving": {"engine": _engine(), "latency_model": {"profile": "profile.yaml"}},
    }))
    model = Simulation(load_scenario(scenario_file)).replicas[0].latency
    assert isinstance(model, BatchTableLatency)
    assert model.step_time_s(300, 2, 600, 45_150) == pytest.approx(result.model().step_time_s(300, 2, 600, 45_150), rel=1e-5)
    assert model.prefill_token_us == pytest.approx(TRUTH["prefill_token_us"], rel=1e-4)
    assert list(model.decode_step_us) == pytest.approx(TRUTH["decode_step_us"], rel=1e-4)


def test_without_cached_prefix_samples_cache_restore_is_at_its_default(tmp_path):
    """A probe without the extension and restore phases leaves ``cache_restore_us`` at its
    documented default 0, its interval null, its source ``default``, and says why."""
    result = probe_estimate(_simulated_probe(tmp_path, keep=lambda phase: not phase.startswith(("extension", "restore"))))
    assert result.params["cache_restore_us"] == 0.0
    assert result.intervals["cache_restore_us"] is None and result.sources["cache_restore_us"] == "default"
    assert any("cache_restore_us at its default 0" in w for w in result.warnings)
    assert result.params["prefill_token_us"] == pytest.approx(TRUTH["prefill_token_us"], rel=1e-4)


def test_without_the_mixed_phase_prefill_step_is_the_per_pass_cost(tmp_path):
    """Without prompts joining a decoder, ``prefill_step_us`` is the whole per-pass cost of an idle
    server (prefill_step + prefill_only_step of the truth) and ``prefill_only_step_us`` stays at
    its default 0, as documented."""
    result = probe_estimate(_simulated_probe(tmp_path, keep=lambda phase: not phase.startswith("mixed")))
    assert result.params["prefill_step_us"] == pytest.approx(TRUTH["prefill_step_us"] + TRUTH["prefill_only_step_us"], rel=1e-4)
    assert result.params["prefill_only_step_us"] == 0.0 and result.sources["prefill_only_step_us"] == "default"
    assert result.params["alpha0_us"] == pytest.approx(TRUTH["alpha0_us"], rel=1e-4)


def test_on_a_one_pass_engine_alpha0_is_not_told_apart(tmp_path):
    """On an engine that computes every probe prompt in one pass (no prompt breaks, no forward
    passes: vLLM-like), the fixed cost per isolated prompt cannot be split between alpha0 and the
    prompt-only step: alpha0 stays at its default 0 and prefill_only_step_us takes the rest
    (truth alpha0 + prefill_only_step), with a warning; the other terms are exact."""
    result = probe_estimate(_simulated_probe(tmp_path, preset=False))
    assert result.params["alpha0_us"] == 0.0 and result.sources["alpha0_us"] == "default"
    assert result.params["prefill_only_step_us"] == pytest.approx(TRUTH["alpha0_us"] + TRUTH["prefill_only_step_us"], rel=1e-4)
    assert result.params["prefill_step_us"] == pytest.approx(TRUTH["prefill_step_us"], rel=1e-4)
    assert result.params["prefill_token_us"] == pytest.approx(TRUTH["prefill_token_us"], rel=1e-4)
    assert any("cannot be told apart" in w for w in result.warnings)


def test_a_trace_without_isolated_prompts_gives_no_profile(tmp_path):
    """The isolated phase is what every profile needs: without it the estimate fails, saying so."""
    with pytest.raises(ProbeError, match="isolated prompts"):
        probe_estimate(_simulated_probe(tmp_path, keep=lambda phase: phase != "isolated"))


# ----------------------------------------------------------------------------- statistics and design


def test_median_interval_is_the_order_statistics_interval():
    """For 20 values the 95 % interval of the median is [x(6), x(15)]: P(Binomial(20, 1/2) <= 5)
    = 21700 / 2^20 = 0.0207 <= 0.025 < P(<= 6) = 0.0577."""
    assert sum(math.comb(20, k) for k in range(6)) == 21700
    values = np.arange(20, 0, -1) * 10.0  # 200, 190, ..., 10
    assert median_interval(values) == (105.0, 60.0, 150.0)
    assert median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) == (3.0, None, None)  # 5 values: the extremes cover 93.75 %


@pytest.mark.parametrize("budget", [35.0, 60.0, 120.0])
def test_the_design_fits_the_budget(budget):
    """The design planned for a budget is within it (when the smallest design fits), uses every
    size up to the slots, and keeps its prompts within the slot's context."""
    d = plan_design(short_ttft_s=0.08, token_s=0.004, step_s=0.03, parallel=4, max_prompt_tokens=2030, budget_s=budget)
    assert d.planned_s <= budget
    assert d.decode_sizes == (1, 2, 3, 4) and max(d.isolated_lengths) <= 1600
    assert d.planned_s == pytest.approx(sum(d.phase_s.values()))
    assert d.isolated_lengths[0] == 4 and len(d.isolated_lengths) == 8


def test_a_budget_too_short_gives_the_smallest_design():
    """Below what the smallest design needs, the smallest design (it is then over budget)."""
    d = plan_design(short_ttft_s=0.08, token_s=0.004, step_s=0.03, parallel=4, max_prompt_tokens=2030, budget_s=1.0)
    assert d.scale == 0.18 and d.planned_s > 1.0


def test_many_slots_measure_doubling_sizes():
    """Above 8 slots, sizes 1-8, then doubling, then the slot count."""
    d = plan_design(short_ttft_s=0.01, token_s=0.0001, step_s=0.01, parallel=20, max_prompt_tokens=4000, budget_s=600)
    assert d.decode_sizes == (1, 2, 3, 4, 5, 6, 7, 8, 16, 20)


# ----------------------------------------------------------------------------- live: the emulated server

LIVE: dict[str, Any] = {
    "decode_step_us": [30000.0, 45000.0, 55000.0],
    "prefill_step_us": 25000.0,
    "prefill_only_step_us": 40000.0,
    "prefill_token_us": 500.0,
    "prefill_pair_us": 0.4,
    "alpha0_us": 50000.0,
    "decode_context_us": 30.0,
}
"""The emulated server's coefficients (µs): steps of 30-55 ms and prompts of up to ~0.9 s, so that
the emulator's few milliseconds of timing error stay within a few percent of each term."""

BREAKS, UBATCH = (516, 4), 512
"""The ``llamacpp`` preset's prompt breaks and forward-pass size (n_ubatch 512)."""


def _live_scenario():
    return scenario_from_dict({
        "name": "probe-live", "seed": 2,
        "workload": {"aggregate_rate": 1.0, "num_requests": 1, "clients": [{
            "id": "c", "arrival": {"process": "poisson"},
            "input_distribution": {"type": "constant", "params": {"value": 10}},
            "output_distribution": {"type": "constant", "params": {"value": 5}}}]},
        "serving": {"engine": _engine(cache_prompt=False), "latency_model": {"kind": "batch_table", "params": LIVE}},
    })


def _design_row(prompt: int) -> list[float]:
    """(1, passes, P, attention pairs) of a fresh prompt on an idle llama.cpp-like engine, by hand:
    the last 4 tokens in a step of their own, the 512 before them in another, the rest first
    (each within one 512-token pass for prompts up to 1,028 tokens); a chunk of c tokens after p
    has c p + c (c + 1) / 2 pairs."""
    if prompt <= 4:
        chunks = [prompt]
    elif prompt <= 516:
        chunks = [prompt - 4, 4]
    else:
        chunks = [prompt - 516, 512, 4]
    assert max(chunks) <= UBATCH
    pairs, before = 0, 0
    for c in chunks:
        pairs += c * before + c * (c + 1) // 2
        before += c
    return [1.0, float(len(chunks)), float(prompt), float(pairs)]


def _leverage(x: np.ndarray) -> np.ndarray:
    """The least-squares weights: estimate_j = sum_i w[j, i] y_i."""
    return np.linalg.pinv(x)


def _simulated_times(scenario, served: Path) -> dict[int, np.ndarray]:
    """Every served request's arrival and token times as the server simulated them, from the
    offline replay of its served trace (the same simulation: docs/emulate.md), by probe request id."""
    from simpy_llm.observe.emulate import replay_scenario

    tokens: dict[int, list[float]] = {}
    sim = Simulation(replay_scenario(scenario, served), token_listener=lambda req, _k, t: tokens.setdefault(req.id, []).append(t))
    records = sim.run(progress=False).to_dataframe()
    out = {}
    for r in records.itertuples(index=False):
        rid = int(str(r.client_id).rsplit("/", 1)[1])
        out[rid] = np.array([r.arrival_s, *tokens[r.request_id]])
    return out


def _ideal_trace(probe_dir: Path, simulated: dict[int, np.ndarray], out: Path) -> Path:
    """The probe's trace with every time as the server simulated it (no timing error, no round trip)."""
    trace = read_trace_v2(probe_dir / "trace")
    f = trace.frame.copy()
    for i, row in f.iterrows():
        t = simulated[int(row["request_id"])]
        send = int(row["send_time_us"])
        tokens_us = [send + round((x - t[0]) * 1e6) for x in t[1:]]
        f.loc[i, ["first_token_time_us", "first_chunk_time_us", "last_chunk_time_us", "done_time_us"]] = (
            tokens_us[0], tokens_us[0], tokens_us[-1], tokens_us[-1])
        f.loc[i, "itl_us"] = " ".join(str(b - a) for a, b in itertools.pairwise(tokens_us))
    header = {**trace.header, "network": {"measured_rtt_ms": 0.0}}
    write_trace_v2(f, out / "trace", header=header)
    return out


def test_the_probe_recovers_an_emulated_servers_coefficients(tmp_path):
    """The truth test. The probe runs over HTTP against an in-process emulated server (the
    ``llamacpp`` engine preset, 3 slots, a ``batch_table`` model of known coefficients :data:`LIVE`).

    1. Within its 40 s budget, every phase the server allows produced samples; the cached-prefix
       phases are skipped (the emulated server caches nothing across requests), saying so.
    2. **The design identifies the truth**: the same trace with every time replaced by the one the
       server simulated (the offline replay of its served trace, which equals it exactly) gives back
       every coefficient to the microsecond rounding.
    3. **The live estimates are within their intervals of the truth, widened by what the
       emulator's timing error does to them.** The emulator's error is the arrival gap plus the
       delivery lateness (docs/emulate.md); the test measures it request by request from the same
       replay: each TTFT's error ``e`` and each token gap's error ``d``. A least-squares
       coefficient is ``sum_i w_i y_i`` with the weights ``w`` of its design matrix (built here by
       hand), so the errors move it by exactly ``sum_i w_i e_i`` (alpha0: less the round trip the
       probe subtracts). A median of gaps that are all ``D(n) + d_k`` moves by the median of their
       ``d_k``: between the quartiles of the errors of the request whose gaps the probe read (the
       test takes the largest over the group's requests).
       ``prefill_step`` (the mean of the decoder's mixed gaps less the median of its pure ones and
       the prompt terms) moves by the mean mixed-gap error less the median pure-gap error less the
       prompt terms' shifts times the mixed steps' mean tokens and pairs; ``prefill_only_step`` by
       that and the per-pass cost's shift. A context term rides on each (the decode context's
       shift times the largest context).
    4. The test is informative: each error effect is under a quarter of its coefficient and each
       interval under half of it wide (measured on a 2-core machine shared with other work: effects
       0.3-13 %, widths 0.1-27 %).
    """
    scenario = _live_scenario()

    async def go():
        async with EmulatedServer(scenario, trace=tmp_path / "served") as server:
            result = await run_probe_async(server.url, tmp_path / "probe", server_type="emulated", max_seconds=40.0, seed=7)
        return result, server.scenario

    result, served_scenario = asyncio.run(go())
    stats = result.statistics
    # 1. Budget and phases.
    assert stats["duration_s"] <= 40.0 and stats["elapsed_s"] <= 40.0 + 5.0  # the estimate after the last request
    assert stats["isolated"]["requests"] == 16 and stats["isolated"]["decode_gaps"] == 16
    assert set(stats["decode"]["gaps"]) == {1, 2, 3} and min(stats["decode"]["gaps"].values()) >= 20
    assert stats["mixed"]["mixed_steps"] == 8  # 4 joiners of 2 prompt steps each
    assert set(stats["skipped"]) == {"extension", "restore"}
    assert result.sources["cache_restore_us"] == "default" and result.intervals["cache_restore_us"] is None

    # 2. The design identifies the truth.
    simulated = _simulated_times(served_scenario, tmp_path / "served")
    ideal = probe_estimate(_ideal_trace(tmp_path / "probe", simulated, tmp_path / "ideal"), parallel=3)
    assert ideal.params["decode_step_us"] == pytest.approx(LIVE["decode_step_us"], rel=1e-4)
    for name in ("prefill_step_us", "prefill_only_step_us", "prefill_token_us", "alpha0_us", "decode_context_us"):
        assert ideal.params[name] == pytest.approx(LIVE[name], rel=1e-4), name
    assert ideal.params["prefill_pair_us"] == pytest.approx(LIVE["prefill_pair_us"], rel=2e-3)

    # 3. Timing errors, measured request by request, and what they do to each estimate.
    trace = read_trace_v2(tmp_path / "probe" / "trace").frame.set_index("request_id")
    phase = trace["client_id"]
    ttft_err, gap_err = {}, {}
    for rid, t in simulated.items():
        row = trace.loc[rid]
        ttft_err[rid] = (row["first_token_time_us"] - row["send_time_us"]) / 1e6 - (t[1] - t[0])
        observed_gaps = [int(g) for g in str(row["itl_us"]).split()]
        gap_err[rid] = np.array(observed_gaps, dtype=float) / 1e6 - np.diff(t[1:])
    assert min(ttft_err.values()) >= -2e-6  # no first token before its time (whole microseconds)
    iso = [rid for rid in sorted(simulated) if phase[rid] == "isolated"]
    prompts = [int(trace.loc[rid, "input_tokens"]) for rid in iso]
    w = _leverage(np.array([_design_row(p) for p in prompts]))
    shift = w @ np.array([ttft_err[rid] for rid in iso])  # intercept, per pass, per token, per pair (s)
    # decode_context is the slope of each request's median gap on its median gap's context, so its
    # error is the slope of how far each observed median lies from the served one
    sim_gaps = {rid: np.diff(simulated[rid][1:]) for rid in iso}
    median_err = [float(np.median(sim_gaps[rid] + gap_err[rid]) - np.median(sim_gaps[rid])) for rid in iso]
    contexts = [p + (len(sim_gaps[rid]) - 1) / 2 for p, rid in zip(prompts, iso, strict=True)]
    shift_dc = _leverage(np.array([[1.0, c] for c in contexts]))[1] @ np.array(median_err)
    rtt = stats["rtt_ms"] / 1e3

    # D(n): a median of gaps that are all D(n) + d_k moves by the median of their d_k; the test takes
    # the quartiles of each request's window (the probe's own window may differ by a boundary gap).
    def quartile_bound(rids: list[int], lo: float, hi: float) -> float:
        out = 0.0
        for rid in rids:
            t = simulated[rid][1:]
            inside = (t[:-1] >= lo - 1e-9) & (t[1:] <= hi + 1e-9)
            out = max(out, *np.abs(np.percentile(gap_err[rid][inside], [25, 75])))
        return out

    decode_bound = {}
    for n in (1, 2, 3):
        rids = [rid for rid in simulated if phase[rid] == f"decode.{n}"]
        lo = max(simulated[rid][1] for rid in rids)
        hi = min(simulated[rid][-1] for rid in rids)
        decode_bound[n] = quartile_bound(rids, lo, hi) + abs(shift_dc) * n * 60  # contexts under 60 tokens each

    # prefill_step: the mean error of the decoder's mixed gaps (each joiner's 2 prompt steps end at the
    # decoder's tokens at the joiner's first token and the one before) less the median error of its
    # pure gaps, plus the prompt terms' shifts times the mixed steps' mean tokens and pairs.
    decoder = next(rid for rid in simulated if phase[rid] == "mixed.decoder")
    t_dec = simulated[decoder][1:]
    mixed_k, tokens, pairs = [], [], []
    for rid in simulated:
        if phase[rid] != "mixed.joiner":
            continue
        k = int(np.argmin(np.abs(t_dec - simulated[rid][1])))
        assert abs(t_dec[k] - simulated[rid][1]) < 1e-9  # the same step
        p = int(trace.loc[rid, "input_tokens"])
        mixed_k += [k - 1, k]  # gaps (k-2 -> k-1) and (k-1 -> k) hold the chunks p - 4 and 4
        tokens += [p - 4, 4]
        pairs += [(p - 4) * (p - 3) // 2, 4 * (p - 4) + 10]
    d_dec = gap_err[decoder]
    pure = np.delete(d_dec, [k - 1 for k in mixed_k])
    step_shift = (np.mean(d_dec[[k - 1 for k in mixed_k]]) - np.median(pure)
                  - shift[2] * np.mean(tokens) - shift[3] * np.mean(pairs))
    step_bound = abs(step_shift) + abs(shift_dc) * (16 + len(t_dec))
    bounds_us = {
        "prefill_token_us": abs(shift[2]) * 1e6,
        "prefill_pair_us": abs(shift[3]) * 1e6,
        "alpha0_us": abs(shift[0] - rtt) * 1e6,
        "decode_context_us": abs(shift_dc) * 1e6,
        "prefill_step_us": step_bound * 1e6,
        "prefill_only_step_us": (abs(shift[1]) + step_bound) * 1e6,
    }
    for name, bound in bounds_us.items():
        low, high = result.intervals[name]
        assert low - bound <= LIVE[name] <= high + bound, (name, result.params[name], low, high, bound)
        assert bound <= 0.25 * LIVE[name], (name, bound)
        assert high - low <= 0.5 * LIVE[name], (name, low, high)
    for n, ((low, high), truth) in enumerate(zip(result.intervals["decode_step_us"], LIVE["decode_step_us"], strict=True), 1):
        bound = decode_bound[n] * 1e6
        assert low - bound <= truth <= high + bound, (n, low, high, bound)
        assert bound <= 0.25 * truth and high - low <= 0.5 * truth


# ----------------------------------------------------------------------------- prompts of exact length


def _tokenizer_app(with_tokenize: bool) -> web.Application:
    """A server that counts like llama.cpp's ``/tokenize``: one token per word, plus the start token
    with ``add_special``; ``/apply-template`` wraps a chat message in two template words."""

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        words = body["content"].split()
        return web.json_response({"tokens": [0] * (len(words) + (1 if body.get("add_special") else 0))})

    async def template(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"prompt": "<turn> " + body["messages"][0]["content"] + " <end>"})

    app = web.Application()
    if with_tokenize:
        app.router.add_post("/tokenize", tokenize)
        app.router.add_post("/apply-template", template)
    return app


@pytest.mark.parametrize(("api", "words_for_100"), [("completions", 99), ("chat", 97)])
def test_prompts_have_the_exact_length_the_servers_tokenizer_counts(api, words_for_100):
    """With ``/tokenize`` (and ``/apply-template`` for chat), a prompt of 100 tokens is the number
    of words the server's count makes 100: 99 words and the start token for completions, 97 words
    in a chat template of 2 words and the start token."""

    async def go() -> tuple[str, int]:
        async with (
            TestServer(_tokenizer_app(True), host="127.0.0.1") as server,
            OpenAIClient(str(server.make_url("")).rstrip("/"), model="m") as client,
        ):
            prompts = _Prompts(client, api, "t")
            await prompts.setup()
            assert prompts.tokenize
            return await prompts.make(100, "k")

    text, n = asyncio.run(go())
    assert n == 100 and len(text.split()) == words_for_100


def test_without_tokenize_prompts_count_words_and_learn_the_servers_offset():
    """Without ``/tokenize`` a prompt of n tokens is n words until a request's ``usage`` shows the
    server counts more (here 1 more: a start token); from then on it is n - 1 words."""

    async def go() -> tuple[tuple[str, int], tuple[str, int]]:
        async with (
            TestServer(_tokenizer_app(False), host="127.0.0.1") as server,
            OpenAIClient(str(server.make_url("")).rstrip("/"), model="m") as client,
        ):
            prompts = _Prompts(client, "completions", "t")
            await prompts.setup()
            assert not prompts.tokenize
            before = await prompts.make(50, "a")
            prompts.learn(before[1], 51)  # the server reported 51 prompt tokens for it
            return before, await prompts.make(50, "b")

    (text_a, n_a), (text_b, n_b) = asyncio.run(go())
    assert (len(text_a.split()), n_a) == (50, 50)
    assert (len(text_b.split()), n_b) == (49, 50)


# ----------------------------------------------------------------------------- command line

FAST: dict[str, Any] = {
    "name": "probe-fast", "seed": 3,
    "workload": {"aggregate_rate": 1.0, "num_requests": 1, "clients": [{
        "id": "c", "arrival": {"process": "poisson"},
        "input_distribution": {"type": "constant", "params": {"value": 10}},
        "output_distribution": {"type": "constant", "params": {"value": 5}}}]},
    "serving": {
        "engine": {"preset": "llamacpp", "n_parallel": 2, "ctx_per_slot": 512, "cache_prompt": False},
        "latency_model": {"kind": "batch_table", "params": {
            "decode_step_us": [4000.0, 6000.0], "prefill_step_us": 2000.0, "prefill_only_step_us": 1000.0,
            "prefill_token_us": 40.0, "alpha0_us": 3000.0}},
    },
}
"""A quick emulated server for the command line (a probe of it takes a couple of seconds)."""


@pytest.fixture(scope="module")
def fast_server(tmp_path_factory):
    """``simpy-llm serve`` of :data:`FAST` as a process (stopped by its PID at the end)."""
    workdir = tmp_path_factory.mktemp("serve")
    scenario_file = workdir / "fast.yaml"
    scenario_file.write_text(yaml.safe_dump(FAST))
    with serve_process(scenario_file, workdir) as server:
        yield server


def test_cli_probe_writes_the_trace_and_the_profile(fast_server, tmp_path, capsys):
    """``calibrate probe --url U --server-type emulated --out DIR`` sends the design within its
    budget, prints the coefficients with their intervals and sources, and writes the trace (header:
    the server block as observe writes it, the probe's budget and slots, the phases the server
    cannot run) and a profile that ``calibrate fit`` could take as priors."""
    out = tmp_path / "probe"
    assert main(["calibrate", "probe", "--url", fast_server.url, "--server-type", "emulated", "--out", str(out),
                 "--max-seconds", "30", "--seed", "5"]) == 0
    printed = capsys.readouterr().out
    assert "decode_step_us D(2)" in printed and "prefill_token_us" in printed and "default" in printed
    assert f"wrote trace.yaml, trace.csv and profile.yaml in {out}" in printed
    header = read_trace_v2(out / "trace").header
    assert header["server"]["type"] == "emulated" and header["server"]["max_num_seqs"] == 2
    assert header["probe"]["parallel"] == 2 and header["probe"]["budget_s"] == 30.0 and header["probe"]["seed"] == "5"
    assert set(header["probe"]["skipped"]) == {"extension", "restore"} and header["warm_up_requests"] == 3
    profile = yaml.safe_load((out / "profile.yaml").read_text())
    assert profile["fit"]["method"] == "probe" and len(profile["latency_model"]["params"]["decode_step_us"]) == 2
    assert profile["fit"]["probe"]["duration_s"] <= 30.0
    assert set(profile["fit"]["probe"]["warm_up"]) == {"short_ttft_s", "token_s", "step_s"}
    assert profile["fit"]["sources"]["cache_restore_us"] == "default"


def test_cli_probe_of_one_slot_over_chat_skips_the_mixed_phase(fast_server, tmp_path, capsys):
    """``--parallel 1 --api chat``: one decode size, chat requests, and no mixed phase (a prompt
    cannot join a decoding request in one slot), so prefill_step_us is the per-pass cost and
    prefill_only_step_us stays at its default, each said in the warnings."""
    out = tmp_path / "probe"
    assert main(["calibrate", "probe", "--url", fast_server.url, "--server-type", "emulated", "--out", str(out),
                 "--max-seconds", "30", "--parallel", "1", "--api", "chat"]) == 0
    printed = capsys.readouterr().out
    assert "one slot: a prompt cannot join a decoding request" in read_trace_v2(out / "trace").header["probe"]["skipped"]["mixed"]
    assert "no prompt joined a decoding request" in printed
    profile = yaml.safe_load((out / "profile.yaml").read_text())
    assert profile["fit"]["sources"]["prefill_only_step_us"] == "default"
    assert len(profile["latency_model"]["params"]["decode_step_us"]) == 1
    assert set(read_trace_v2(out / "trace").frame["client_id"]) == {"warm_up", "isolated", "decode.1"}


def test_cli_probe_keeps_to_a_budget_shorter_than_its_smallest_design(fast_server, tmp_path, capsys):
    """With a 0.05 s budget (the warm-up alone takes longer on this server), the probe warns that
    its smallest design overruns, sends what a profile needs (one round of isolated prompts, D(1)),
    cuts the isolated phase's second round and the decode sizes from 2 on, skips the mixed phase,
    and still writes a profile whose D(2) is D(1) (flat beyond the sizes measured, no interval)."""
    out = tmp_path / "probe"
    assert main(["calibrate", "probe", "--url", fast_server.url, "--server-type", "emulated", "--out", str(out),
                 "--max-seconds", "0.05"]) == 0
    printed = capsys.readouterr().out
    for text in ("the smallest design is planned to take", "isolated phase cut short by the budget after 1 round(s)",
                 "decode phase cut short by the budget: batch sizes from 2 on not measured",
                 "mixed phase skipped: the budget ran out", "D(n) for n = 2 interpolated"):
        assert text in printed, text
    phases = read_trace_v2(out / "trace").frame["client_id"].value_counts().to_dict()
    assert phases == {"warm_up": 3, "isolated": 8, "decode.1": 1}
    profile = yaml.safe_load((out / "profile.yaml").read_text())
    d1, d2 = profile["latency_model"]["params"]["decode_step_us"]
    assert d1 == d2 and profile["fit"]["intervals"]["decode_step_us"][1] is None


def test_cli_probe_needs_a_slot_count(fast_server, tmp_path, capsys):
    """A server whose description gives no slot count (type ``other``) needs ``--parallel``: exit 2,
    saying so, before the probe sends anything but discovery."""
    assert main(["calibrate", "probe", "--url", fast_server.url, "--server-type", "other", "--out", str(tmp_path / "p")]) == 2
    assert "--parallel N" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-seconds", "0"], "--max-seconds must be a number > 0, got 0.0"),
        (["--max-seconds", "nan"], "--max-seconds must be a number > 0, got nan"),
        (["--parallel", "0"], "--parallel must be at least 1, got 0"),
    ],
)
def test_cli_probe_rejects_bad_options(tmp_path, capsys, args, message):
    """Bad budgets and slot counts are refused (exit 2) before anything is sent."""
    assert main(["calibrate", "probe", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "p"), *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def test_cli_probe_reports_a_bad_server_config_and_an_unwritable_out(tmp_path, capsys):
    """A server config with a bad value is an error naming the file and the key (exit 2); an
    --out inside a file is an error naming the option (exit 2); nothing is sent either way."""
    bad = tmp_path / "server.yaml"
    bad.write_text("server: {type: llamacpp, n_parallel: 0}\n")
    assert main(["calibrate", "probe", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "p"), "--server-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "server.n_parallel: must be a whole number >= 1, got 0" in err
    (tmp_path / "file").write_text("x")
    assert main(["calibrate", "probe", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "file" / "p")]) == 2
    assert "--out" in capsys.readouterr().err


def test_cli_probe_of_an_unreachable_server_exits_1(tmp_path, capsys):
    """No server at the URL: exit 1, naming it."""
    assert main(["calibrate", "probe", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "p"), "--max-seconds", "5"]) == 1
    assert "cannot reach http://127.0.0.1:9" in capsys.readouterr().err


def test_cli_probe_default_budget_is_the_modules():
    """The command's help states the module's default budget."""
    from simpy_llm.cli import _parser

    sub = _parser()._subparsers._group_actions[0].choices["calibrate"]._subparsers._group_actions[0].choices["probe"]
    assert f"default {DEFAULT_MAX_SECONDS:g}" in sub.format_help()
