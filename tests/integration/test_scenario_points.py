"""Each ServeGen, Azure and llama.cpp scenario shows what its header says to look at, on the shortened
run of ``test_scenarios.py`` (the same run, made once)."""

from __future__ import annotations

import numpy as np

from tests.integration.test_scenarios import run_short


def _completed(results):
    c = results.columns
    return {k: v[c["status"] == "completed"] for k, v in c.items()}


def test_servegen_m_large_day_queues_in_a_bursty_window_not_a_busier_calm_one():
    """From 19:20 the day has a bursty 10-minute window and then a calm one with at least as
    many requests. The p99 queueing delay of the bursty window's arrivals is over four times
    the calm one's (measured ~0.3 s against ~0.035 s), and its minute samples hold longer
    waiting queues: the queueing comes from the clients' burstiness, not from the volume,
    which is what the whole day shows hour by hour."""
    res = run_short("servegen_m_large_day.yaml")
    c = _completed(res)
    t = c["arrival_s"]
    delay = c["first_scheduled_s"] - c["enqueue_s"]
    busy, calm = t < 600, t >= 600
    assert calm.sum() >= busy.sum() > 1000
    assert np.percentile(delay[busy], 99) > 4 * np.percentile(delay[calm], 99)
    ts = res.timeseries()
    assert ts[ts["time_s"] < 600]["waiting"].max() > ts[ts["time_s"] >= 600]["waiting"].max()


def test_servegen_multimodal_ttft_is_mostly_prefill_under_load():
    """Image tokens are over half of the prompt tokens, and on a loaded replica (queueing is
    over a quarter of the mean TTFT, measured ~36 %) the steps that compute a prompt (first
    token - first scheduled) are still over half of it (~60 %): long multimodal prompts
    make TTFT a prefill figure. Their prefill chunks also stretch the steps decoding
    requests share with them: TPOT's p99 (~80 ms) breaks the 50 ms target."""
    res = run_short("servegen_multimodal.yaml")
    c = _completed(res)
    assert c["image_tokens"].sum() > 0.5 * c["prompt_tokens"].sum()
    ttft = c["first_token_s"] - c["arrival_s"]
    prefill = c["first_token_s"] - c["first_scheduled_s"]
    queued = c["first_scheduled_s"] - c["enqueue_s"]
    assert queued.mean() > 0.25 * ttft.mean()
    assert prefill.mean() > 0.5 * ttft.mean()
    tpot = (c["completion_s"] - c["first_token_s"])[c["output_tokens"] > 1] / (c["output_tokens"][c["output_tokens"] > 1] - 1)
    assert np.percentile(tpot, 99) > res.scenario.slo["interactive"].tpot_s


def test_servegen_reasoning_is_decode_and_kv_bound():
    """Long reasoning outputs keep many requests decoding at once: KV utilisation above 0.4
    (measured ~0.54) with a mean batch above 100 requests (~150), and more than three output
    tokens for each prompt token served (~4.8). A profile whose steps are far too fast (the
    H100 TP4 fit this scenario used to run on) gives 0.04 % KV use and batches of 1."""
    s = run_short("servegen_reasoning.yaml").summary()
    assert s["kv_utilization"]["time_weighted_mean"] > 0.4
    assert s["batch_size"]["mean"] > 100
    assert s["throughput"]["output_tokens_per_s"] > 3 * s["throughput"]["input_tokens_per_s"]


def _unloaded_ttft_s(results, prompt_tokens: np.ndarray) -> np.ndarray:
    """TTFT of each prompt on an idle replica: the arrival-to-queue time, the prefill steps
    (chunks of max_num_batched_tokens) and the per-token overhead, from the latency model."""
    from simpy_llm.serving.fleet import plan_fleet

    plan = plan_fleet(results.scenario.serving)[0]
    lat, budget = plan.latency, plan.engine.max_num_batched_tokens
    out = []
    for p in prompt_tokens.tolist():
        total, done = lat.queueing_time_s(p), 0
        while done < p:
            chunk = min(budget, p - done)
            pairs = chunk * done + chunk * (chunk + 1) // 2
            total += lat.step_time_s(chunk, 0, prefill_attention_pairs=pairs)
            done += chunk
        out.append(total + lat.output_token_overhead_s)
    return np.array(out)


def test_azure_conversation_replay_queues_above_the_unloaded_ttft():
    """Replayed as recorded on one node, the trace's p90 TTFT is over 1.5 times the p90 TTFT
    the same prompts would get on an idle replica (measured ~2x): the real arrivals queue
    and share steps, so TTFT is not the latency model's prefill time. Some requests miss
    the SLO (goodput fraction below 1), most meet it (above 0.9)."""
    res = run_short("azure_conversation_replay.yaml")
    c = _completed(res)
    ttft = c["first_token_s"] - c["arrival_s"]
    unloaded = _unloaded_ttft_s(res, c["prompt_tokens"])
    assert np.percentile(ttft, 90) > 1.5 * np.percentile(unloaded, 90)
    assert 0.9 < res.summary()["goodput"]["fraction"] < 1.0


def test_llamacpp_cpu_later_rounds_compute_only_what_is_new():
    """On the llama.cpp preset a session's round k finds round k-1's prompt cached less the 5
    tokens past its last checkpoint, not round k-1's answer: every later round's cached
    tokens equal its predecessor's prompt less 5, and its TTFT stays near the first round's
    although its prompt is several times longer."""
    res = run_short("llamacpp_cpu.yaml")
    f = res.to_dataframe().sort_values(["session_id", "round_index"])
    later = f[f.round_index > 0]
    previous = f.groupby("session_id").shift(1).loc[later.index]
    assert len(later) > 30
    assert (later.cached_tokens == previous.prompt_tokens - 5).all()
    assert later.prompt_tokens.mean() > 3 * f[f.round_index == 0].prompt_tokens.mean()
    assert later.ttft_s.mean() < 2 * f[f.round_index == 0].ttft_s.mean()
