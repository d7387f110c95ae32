"""Real data, deterministic: a probe of the llama.cpp server as the priors of a fit, and a
workload the fit has not seen (``tests/data/calibration``, recorded by its ``record.py``).

The probe (``llamacpp_probe``), the fitting workload of short prompts (``llamacpp_short_prompts``,
40-280 tokens, prompt cache off) and the held-out one (``llamacpp_held_out_chat``: bursty
three-round chat sessions, prompts up to 1,288 tokens, prompt cache on) were recorded one after
the other on the same server. The open-loop, multi-turn and shared-prefix traces were recorded on
an earlier day, when the machine ran the server about twice as fast; fitted with this probe's
priors, the open-loop fit says so. Every figure asserted is the figure reached
(``docs/calibration.md``, "Predicting a workload the fit has not seen").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from simpy_llm.calibrate import compare, fit
from simpy_llm.calibrate.probe_estimate import probe_estimate
from simpy_llm.config.profile import load_profile

DATA = Path(__file__).resolve().parents[1] / "data" / "calibration"
PROBE = DATA / "llamacpp_probe"
SHORT = DATA / "llamacpp_short_prompts"
HELD_OUT = DATA / "llamacpp_held_out_chat"


@pytest.fixture(scope="module")
def short_with_probe():
    """The fit of the short-prompt trace with the probe's profile as priors."""
    return fit(SHORT, priors=PROBE / "profile.yaml")


PROBE_RUNS = {"held-out session": PROBE, "earlier": DATA / "llamacpp_probe_runs" / "earlier",
              "long": DATA / "llamacpp_probe_runs" / "long"}
"""The committed probes of the same server: the one recorded with the two traces, one 37 minutes
before them (default budget), and one after them with a 240 s budget (prompts up to 1,600 tokens)."""


@pytest.mark.parametrize("run", sorted(PROBE_RUNS))
def test_the_probe_profile_is_what_its_trace_gives(run):
    """Estimating a committed probe trace again gives its committed profile's coefficients,
    intervals and sources exactly."""
    committed = load_profile(PROBE_RUNS[run] / "profile.yaml")
    ours = probe_estimate(PROBE_RUNS[run] / "trace").profile()
    assert ours["latency_model"] == committed["latency_model"]
    assert ours["fit"]["intervals"] == committed["fit"]["intervals"] and ours["fit"]["sources"] == committed["fit"]["sources"]


def test_what_short_prompts_cannot_determine_comes_from_the_probe(short_with_probe):
    """Over prompts of 43-275 tokens the trace determines the decode steps of one, three and four
    decoders and the prompt costs, but not the step of two decoders (with a KV stream per slot two
    decoders run in one pass only on adjacent slots), the attention term, the context term, the
    base costs or the restore cost: each of those is the probe's value, and the sources say so."""
    probe = load_profile(PROBE / "profile.yaml")["latency_model"]["params"]
    sources = short_with_probe.sources
    assert sources["decode_step_us"] == ["trace", "prior", "trace", "trace"]
    assert short_with_probe.params["decode_step_us"][1] == probe["decode_step_us"][1]
    assert sources["prefill_token_us"] == sources["prefill_step_us"] == "trace"
    for name in ("prefill_pair_us", "decode_context_us", "alpha0_us", "prefill_only_step_us", "cache_restore_us"):
        assert sources[name] == "prior" and short_with_probe.params[name] == probe[name], name
    assert short_with_probe.ranges["prompt_tokens"] == [43, 275]


def test_the_held_out_prediction_warns_of_its_ranges_and_reaches_its_figures(short_with_probe):
    """Predicting the held-out chat from the short-prompt fit: the report warns that its prompts
    (153-1,288 tokens), computed prompt tokens and cached shares lie outside what the fit saw,
    and the prediction reaches E2E MAPE 27.9 % and TTFT 37.5 %, under-predicting both (the goal of
    10 % and 15 % is missed: docs/calibration.md says what the traces show)."""
    cal = compare(HELD_OUT, profile=short_with_probe.profile(), n_resamples=50)
    outside = [w for w in cal.report.warnings if w.startswith("workload outside the profile's fitted range")]
    assert [w.split(":")[1].split()[0] for w in outside] == [
        "prompt_tokens", "concurrency", "uncached_prompt_tokens", "cached_fraction"]
    assert "prompt_tokens 153-1288 outside the fitted range 43-275" in outside[0]
    e2e, ttft = cal.metrics["e2e"], cal.metrics["ttft"]
    assert (e2e.mape, ttft.mape) == pytest.approx((0.2792, 0.3750), abs=0.0005)
    assert e2e.bias < 0 and ttft.bias < 0


def test_a_probe_of_a_slower_machine_is_contradicted_by_the_open_loop_trace():
    """Fitting the open-loop trace (recorded when the machine ran the server twice as fast) with
    this probe's priors: every decode step and the per-token cost come from the trace, each with
    a warning that the prior's interval misses the trace's; the attention term is held at the
    least the trace allows (0.69 µs) rather than the probe's 0.40 µs, with a warning; and the
    multi-turn trace is predicted with E2E MAPE 7.4 % and TTFT 12.6 %."""
    result = fit(DATA / "llamacpp_open_loop", priors=PROBE / "profile.yaml")
    disagree = [w.split(":")[1].split()[0] for w in result.warnings if w.startswith("prior disagrees with the trace")]
    assert disagree == [f"decode_step_us[{i}]" for i in range(4)] + ["prefill_token_us"]
    assert result.sources["prefill_pair_us"] == "trace"
    assert result.params["prefill_pair_us"] == pytest.approx(0.6946, abs=0.001)
    assert any(w.startswith("prefill_pair_us is not determined by this trace") and "rather than the prior 0.397357 µs" in w
               for w in result.warnings)
    cal = compare(DATA / "llamacpp_multi_turn", profile=result.profile(), n_resamples=50)
    assert (cal.metrics["e2e"].mape, cal.metrics["ttft"].mape) == pytest.approx((0.0735, 0.1261), abs=0.0005)


def test_three_probes_agree_on_the_attention_term_only_within_wide_intervals():
    """The attention cost per pair came out at 0.40, 2.73 and 1.22 µs in the three probes; their
    95 % intervals share only 0.49-2.19 µs, and each spans more than a factor of 4: on this
    machine no probe pins the term."""
    runs = {name: load_profile(path / "profile.yaml") for name, path in PROBE_RUNS.items()}
    values = {name: p["latency_model"]["params"]["prefill_pair_us"] for name, p in runs.items()}
    assert values == pytest.approx({"held-out session": 0.397357, "earlier": 2.72642, "long": 1.22196}, rel=1e-5)
    intervals = [p["fit"]["intervals"]["prefill_pair_us"] for p in runs.values()]
    assert (max(lo for lo, _ in intervals), min(hi for _, hi in intervals)) == pytest.approx((0.4936, 2.1934), abs=1e-4)
    assert all(hi > 4 * max(lo, 0.49) for lo, hi in intervals)


def test_the_held_out_prediction_moves_with_the_probe_that_gives_the_priors():
    """With the earlier probe's priors (2.73 µs per pair, a 265 ms restore) the same short-prompt
    trace predicts the held-out chat with E2E MAPE 18.3 % and TTFT 28.7 %, against 27.9 % and
    37.5 % with the held-out session's probe: the prediction hinges on the coefficients the
    fitting trace leaves to the priors."""
    result = fit(SHORT, priors=PROBE_RUNS["earlier"] / "profile.yaml")
    assert result.sources["prefill_pair_us"] == result.sources["cache_restore_us"] == "prior"
    cal = compare(HELD_OUT, profile=result.profile(), n_resamples=50)
    assert (cal.metrics["e2e"].mape, cal.metrics["ttft"].mape) == pytest.approx((0.1828, 0.2874), abs=0.0005)


DOCS_SET = DATA / "llamacpp_held_out_docs_set"
"""The second held-out set, recorded one after the other on a later day: a probe, the short prompts
again, and single documents of 306-1,194 tokens in a Poisson stream (``held_out_docs``)."""


def test_held_out_documents_are_predicted_from_short_prompts_with_their_ranges_warned():
    """Fitted on the short prompts with that day's probe as priors, the documents (prompts up to four
    times the longest fitted) are predicted with E2E MAPE 12.3 % and TTFT 12.4 %, both
    under-predicted, and the report names the prompt lengths outside the fitted range (the E2E goal
    of 10 % is missed, the TTFT goal of 15 % met: docs/calibration.md says what the trace shows)."""
    result = fit(DOCS_SET / "llamacpp_short_prompts", priors=DOCS_SET / "llamacpp_probe" / "profile.yaml")
    cal = compare(DOCS_SET / "llamacpp_held_out_docs", profile=result.profile(), n_resamples=50)
    outside = [w for w in cal.report.warnings if w.startswith("workload outside the profile's fitted range")]
    assert [w.split(":")[1].split()[0] for w in outside] == ["prompt_tokens", "uncached_prompt_tokens"]
    assert "prompt_tokens 306-1194 outside the fitted range 43-275" in outside[0]
    e2e, ttft = cal.metrics["e2e"], cal.metrics["ttft"]
    assert (e2e.mape, ttft.mape) == pytest.approx((0.1228, 0.1240), abs=0.0005)
    assert e2e.bias < 0 and ttft.bias < 0


HALF_LOAD_SET = DATA / "llamacpp_held_out_docs_half_load_set"
"""The third held-out set: a probe with 8 decode gaps per isolated prompt, the short prompts again,
and documents of 317-897 tokens in a Poisson stream (``held_out_docs_half_load``)."""


def test_eight_gaps_per_prompt_halve_the_probe_interval_of_the_context_term():
    """With 8 decode gaps per isolated prompt the probe's 95 % interval of the decode step's cost
    per context token is 0-8.7 µs (estimate 4.03 µs), half the 0-17.3 µs of the same day's probe
    with one gap per prompt (estimate 0.06 µs)."""
    eight = load_profile(HALF_LOAD_SET / "llamacpp_probe" / "profile.yaml")
    one = load_profile(DOCS_SET / "llamacpp_probe" / "profile.yaml")
    assert eight["latency_model"]["params"]["decode_context_us"] == pytest.approx(4.03055, rel=1e-5)
    assert one["latency_model"]["params"]["decode_context_us"] == pytest.approx(0.0584969, rel=1e-5)
    assert eight["fit"]["intervals"]["decode_context_us"] == pytest.approx([0.0, 8.67056], abs=1e-4)
    assert one["fit"]["intervals"]["decode_context_us"] == pytest.approx([0.0, 17.3006], abs=1e-4)


def test_held_out_documents_at_half_load_are_predicted_with_their_figures():
    """Fitted on the short prompts with that day's probe as priors, documents of 317-897 tokens
    arriving at about half the server's capacity are predicted with E2E MAPE 22.9 % and TTFT
    28.4 %, both under-predicted; the fit warns that the decode step of four decoders in the trace
    is not the probe's, recorded minutes before (docs/calibration.md)."""
    result = fit(HALF_LOAD_SET / "llamacpp_short_prompts", priors=HALF_LOAD_SET / "llamacpp_probe" / "profile.yaml")
    assert any(w.startswith("prior disagrees with the trace: decode_step_us[3]") for w in result.warnings)
    cal = compare(HALF_LOAD_SET / "llamacpp_held_out_docs_half_load", profile=result.profile(), n_resamples=50)
    e2e, ttft = cal.metrics["e2e"], cal.metrics["ttft"]
    assert (e2e.mape, ttft.mape) == pytest.approx((0.2293, 0.2841), abs=0.0005)
    assert e2e.bias < 0 and ttft.bias < 0


QUIET_SET = DATA / "llamacpp_held_out_docs_quiet_set"
"""The half-load set's recipe recorded again on an idle machine whose server runs 2-4 times
faster: the same documents keep it about a fifth busy."""


def test_held_out_documents_on_an_idle_machine_are_predicted_within_the_goal():
    """On an idle machine, fitted on the short prompts with that day's probe as priors, documents
    of 317-897 tokens (longer than any fitted prompt) are predicted with E2E MAPE 2.5 % and TTFT
    3.7 %: within the goal of 10 % and 15 % (docs/calibration.md)."""
    result = fit(QUIET_SET / "llamacpp_short_prompts", priors=QUIET_SET / "llamacpp_probe" / "profile.yaml")
    cal = compare(QUIET_SET / "llamacpp_held_out_docs_half_load", profile=result.profile(), n_resamples=50)
    outside = [w for w in cal.report.warnings if w.startswith("workload outside the profile's fitted range")]
    assert "prompt_tokens 317-897 outside the fitted range" in outside[0]
    e2e, ttft = cal.metrics["e2e"], cal.metrics["ttft"]
    assert (e2e.mape, ttft.mape) == pytest.approx((0.0250, 0.0369), abs=0.0005)
    assert e2e.mape <= 0.10 and ttft.mape <= 0.15


BUSY_SET = DATA / "llamacpp_held_out_docs_busy_set"
"""The same documents four times as often, on the idle machine of :data:`QUIET_SET`: the server
about 87 % busy, up to 12 requests in it, TTFTs up to 22 s."""


def test_queued_held_out_documents_on_an_idle_machine_are_predicted_within_the_goal():
    """On an idle machine, with that day's probe as priors, documents of 311-888 tokens arriving
    fast enough to queue (TTFT median 5.6 s, at most 22 s) are predicted with E2E MAPE 1.5 % and
    TTFT 2.2 %; without the probe's priors the same fit misses by 22 % and 21 %."""
    with_probe = fit(BUSY_SET / "llamacpp_short_prompts", priors=BUSY_SET / "llamacpp_probe" / "profile.yaml")
    without = fit(BUSY_SET / "llamacpp_short_prompts")
    held_out = BUSY_SET / "llamacpp_held_out_docs_busy"
    cal = compare(held_out, profile=with_probe.profile(), n_resamples=50)
    bare = compare(held_out, profile=without.profile(), n_resamples=50)
    assert (cal.metrics["e2e"].mape, cal.metrics["ttft"].mape) == pytest.approx((0.0151, 0.0222), abs=0.0005)
    assert (bare.metrics["e2e"].mape, bare.metrics["ttft"].mape) == pytest.approx((0.2192, 0.2074), abs=0.0005)
