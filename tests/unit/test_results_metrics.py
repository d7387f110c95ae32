"""Summary metrics of Results, computed from hand-filled recorders so every figure is known."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from simpy_llm import Recorder, Request, Results, scenario_from_dict
from simpy_llm.metrics.fairness import jain_index
from tests.helpers import tiny_scenario

NAN = math.nan


def _request(
    rid: int,
    *,
    tenant: str = "t0",
    slo_class: str = "default",
    arrival_s: float = 0.0,
    enqueue_s: float | None = None,
    scheduled_s: float | None = None,
    first_token_s: float = NAN,
    completion_s: float = NAN,
    prompt_tokens: int = 100,
    output_tokens: int = 5,
    replica: int = 0,
    cached_tokens: int = 0,
    warm_up: bool = False,
    dropped_reason: str = "",
) -> Request:
    """A request with its lifecycle stamps set (enqueue and first schedule default to arrival
    for requests that produced a token, NaN otherwise)."""
    started = not math.isnan(first_token_s)
    enqueue = enqueue_s if enqueue_s is not None else (arrival_s if started else NAN)
    scheduled = scheduled_s if scheduled_s is not None else (arrival_s if started else NAN)
    return Request(
        id=rid,
        client_id=tenant,
        tenant_id=tenant,
        slo_class=slo_class,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        arrival_s=arrival_s,
        enqueue_s=enqueue,
        first_scheduled_s=scheduled,
        first_token_s=first_token_s,
        completion_s=completion_s,
        replica=replica,
        cached_tokens=cached_tokens,
        warm_up=warm_up,
        dropped_reason=dropped_reason,
    )


def _record(recorder: Recorder, req: Request, status: str) -> None:
    recorder.on_arrival(req, req.arrival_s)
    if status == "completed":
        req.generated_tokens = req.output_tokens
        recorder.on_complete(req)
    elif status == "dropped":
        recorder.on_drop(req)
    else:
        recorder.on_in_flight(req)


def _results(
    recorder: Recorder,
    *,
    end_s: float = 10.0,
    kv_blocks: list[int] | None = None,
    replica_groups: list[str] | None = None,
    slo: dict | None = None,
) -> Results:
    data = tiny_scenario()
    if slo is not None:
        data["slo"] = slo
    return Results.from_recorder(
        recorder,
        scenario=scenario_from_dict(data),
        end_s=end_s,
        wall_s=1.0,
        events=0,
        steps=sum(recorder.steps),
        kv_blocks=kv_blocks if kv_blocks is not None else [100] * recorder.num_replicas,
        replica_groups=replica_groups,
    )


def _completed(rec: Recorder, rid: int, e2e_s: float, **kw) -> None:
    arrival = kw.pop("arrival_s", 0.0)
    _record(
        rec,
        _request(rid, arrival_s=arrival, first_token_s=arrival + e2e_s / 2, completion_s=arrival + e2e_s, **kw),
        "completed",
    )


# --- fairness ---------------------------------------------------------------
def test_jain_index_matches_formula_on_hand_example():
    """J = (sum x)^2 / (n sum x^2): x = (1, 0.5, 0) gives 2.25 / 3.75 = 0.6."""
    assert jain_index([1.0, 0.5, 0.0]) == pytest.approx(0.6, rel=1e-12)


def test_fairness_completed_share_is_jain_of_per_tenant_completion_fractions():
    """Tenant a completes 2 of 2, b 1 of 2 (one dropped), c 0 of 1 (in flight): x = (1, 0.5, 0), J = 0.6."""
    rec = Recorder()
    _completed(rec, 0, 1.0, tenant="a")
    _completed(rec, 1, 1.0, tenant="a")
    _completed(rec, 2, 1.0, tenant="b")
    _record(rec, _request(3, tenant="b", dropped_reason="max_queue"), "dropped")
    _record(rec, _request(4, tenant="c"), "in_flight")
    fair = _results(rec).summary()["fairness"]
    assert fair["tenants"] == 3
    assert fair["completed_share"]["by_tenant"] == {"a": 1.0, "b": 0.5, "c": 0.0}
    assert fair["completed_share"]["jain"] == pytest.approx(0.6, rel=1e-12)


def test_fairness_inverse_normalized_e2e_uses_e2e_per_output_token():
    """a: e2e 2 s over 4 tokens (x = 2/s), b: 4 s over 2 tokens (x = 0.5/s): J = 6.25 / 8.5."""
    rec = Recorder()
    _completed(rec, 0, 2.0, tenant="a", output_tokens=4)
    _completed(rec, 1, 4.0, tenant="b", output_tokens=2)
    fair = _results(rec).summary()["fairness"]["inverse_normalized_e2e"]
    assert fair["by_tenant"] == {"a": pytest.approx(2.0), "b": pytest.approx(0.5)}
    assert fair["jain"] == pytest.approx(6.25 / 8.5, rel=1e-12)


def test_fairness_of_one_tenant_is_one():
    """With a single tenant both indexes are 1.0, even if half its requests were dropped."""
    rec = Recorder()
    _completed(rec, 0, 1.0)
    _record(rec, _request(1, dropped_reason="max_model_len"), "dropped")
    fair = _results(rec).summary()["fairness"]
    assert fair["completed_share"]["jain"] == 1.0
    assert fair["inverse_normalized_e2e"]["jain"] == 1.0


def test_fairness_leaves_out_warm_up_requests():
    """A tenant's dropped warm-up request does not lower its completed share."""
    rec = Recorder()
    _record(rec, _request(0, tenant="a", warm_up=True, dropped_reason="max_queue"), "dropped")
    _completed(rec, 1, 1.0, tenant="a", arrival_s=1.0)
    _completed(rec, 2, 1.0, tenant="b", arrival_s=1.0)
    fair = _results(rec).summary()["fairness"]["completed_share"]
    assert fair["by_tenant"] == {"a": 1.0, "b": 1.0}
    assert fair["jain"] == 1.0


# --- prefix cache -----------------------------------------------------------
def test_prefix_cache_hit_rate_is_cached_over_prompt_tokens_of_admitted_requests():
    """Admitted prompts 100, 200, 100 with 50, 100, 0 cached give 150 / 400; a request never
    admitted (dropped before scheduling) is not counted."""
    rec = Recorder()
    _completed(rec, 0, 1.0, prompt_tokens=100, cached_tokens=50)
    _completed(rec, 1, 1.0, prompt_tokens=200, cached_tokens=100)
    _record(rec, _request(2, prompt_tokens=100, scheduled_s=0.5), "in_flight")
    _record(rec, _request(3, prompt_tokens=1000, dropped_reason="max_model_len"), "dropped")
    cache = _results(rec).summary()["prefix_cache"]
    assert cache == {"hit_rate": 0.375, "cached_tokens": 150, "prompt_tokens": 400}


def test_prefix_cache_hit_rate_is_none_when_nothing_was_admitted():
    """With no admitted request the hit rate is None (0 / 0), the sums 0."""
    rec = Recorder()
    _record(rec, _request(0, dropped_reason="max_queue"), "dropped")
    assert _results(rec).summary()["prefix_cache"] == {"hit_rate": None, "cached_tokens": 0, "prompt_tokens": 0}


# --- drops ------------------------------------------------------------------
def test_dropped_requests_are_counted_by_reason_and_by_class():
    """Drops are counted per reason, and per SLO class then reason; the counts add up to ``dropped``."""
    rec = Recorder()
    drops = [
        ("gold", "max_queue"), ("gold", "max_queue"), ("gold", "slo_shed"),
        ("bronze", "token_bucket"), ("bronze", "max_model_len"), ("bronze", "max_queue"),
    ]
    for i, (cls, reason) in enumerate(drops):
        _record(rec, _request(i, slo_class=cls, dropped_reason=reason), "dropped")
    _completed(rec, len(drops), 1.0, slo_class="gold")
    req = _results(rec).summary()["requests"]
    assert req["dropped"] == 6
    assert req["dropped_by_reason"] == {"max_model_len": 1, "max_queue": 3, "slo_shed": 1, "token_bucket": 1}
    assert req["dropped_by_class"] == {
        "bronze": {"max_model_len": 1, "max_queue": 1, "token_bucket": 1},
        "gold": {"max_queue": 2, "slo_shed": 1},
    }


# --- warm-up ----------------------------------------------------------------
def test_warm_up_requests_are_left_out_of_latency_statistics():
    """A warm-up request's 100 s e2e does not enter the latency figures; it is counted as warm-up."""
    rec = Recorder()
    _completed(rec, 0, 100.0, warm_up=True)
    _completed(rec, 1, 2.0, arrival_s=1.0)
    _completed(rec, 2, 4.0, arrival_s=1.0)
    s = _results(rec, end_s=101.0).summary()
    assert s["latency_s"]["e2e"]["mean"] == pytest.approx(3.0)
    assert s["latency_s"]["ttft"]["mean"] == pytest.approx(1.5)
    assert s["latency_s_by_tenant"]["t0"]["e2e"]["mean"] == pytest.approx(3.0)
    assert s["requests"]["warm_up"] == 1
    assert s["requests"]["completed"] == 3


def test_warm_up_whole_run_throughput_counts_measured_requests_over_the_measured_span():
    """Warm-up from t = 0; measured requests arrive from t = 2 and the run ends at 10: two measured
    completions give a whole-run 2 / 8 requests/s and (2 * 5) / 8 output tokens/s."""
    rec = Recorder()
    _completed(rec, 0, 1.0, warm_up=True)
    _completed(rec, 1, 1.0, warm_up=True, arrival_s=1.0)
    _completed(rec, 2, 3.0, arrival_s=2.0)
    _completed(rec, 3, 8.0, arrival_s=2.0)
    s = _results(rec, end_s=10.0).summary()
    assert s["measurement"] == {"start_s": 2.0, "duration_s": 8.0}
    assert s["throughput"]["whole_run_requests_per_s"] == pytest.approx(0.25)
    assert s["throughput"]["whole_run_output_tokens_per_s"] == pytest.approx(10 / 8)


def test_without_warm_up_whole_run_throughput_divides_by_the_whole_run():
    """No warm-up: the measured span is the run, [0, duration_s]."""
    rec = Recorder()
    _completed(rec, 0, 1.0, arrival_s=2.0)
    s = _results(rec, end_s=4.0).summary()
    assert s["measurement"] == {"start_s": 0.0, "duration_s": 4.0}
    assert s["throughput"]["whole_run_requests_per_s"] == pytest.approx(0.25)


def test_warm_up_requests_are_left_out_of_goodput():
    """A warm-up request missing its e2e target does not lower the goodput fraction."""
    rec = Recorder()
    _completed(rec, 0, 50.0, warm_up=True)
    _completed(rec, 1, 1.0, arrival_s=1.0)
    s = _results(rec, end_s=51.0, slo={"default": {"e2e_s": 5.0}}).summary()
    assert s["goodput"]["fraction"] == 1.0
    assert s["goodput"]["by_class"] == {"default": {"completed": 1, "met": 1, "fraction": 1.0}}


# --- per class / tenant latency --------------------------------------------
def test_latency_by_class_has_each_class_statistics():
    """Class gold has e2e (1, 2, 3, 4): mean 2.5, p50 2.5, p90 3.7 (linear); class silver one value 10."""
    rec = Recorder()
    for i, e2e in enumerate((1.0, 2.0, 3.0, 4.0)):
        _completed(rec, i, e2e, slo_class="gold")
    _completed(rec, 4, 10.0, slo_class="silver")
    by_class = _results(rec, end_s=20.0).summary()["latency_s_by_class"]
    assert sorted(by_class) == ["gold", "silver"]
    gold = by_class["gold"]["e2e"]
    assert gold["mean"] == pytest.approx(2.5)
    assert gold["p50"] == pytest.approx(2.5)
    assert gold["p90"] == pytest.approx(3.7)
    assert by_class["gold"]["ttft"]["mean"] == pytest.approx(1.25)
    assert by_class["silver"]["e2e"] == {k: pytest.approx(10.0) for k in ("mean", "p50", "p90", "p95", "p99")}


def test_latency_by_tenant_has_each_tenant_statistics_including_queue_delay_and_tpot():
    """Tenant a: queue delay 0.5 s, TPOT (4 - 1) / (4 - 1) = 1 s; tenant b: queue delay 0, TPOT 0.25 s."""
    rec = Recorder()
    _record(rec, _request(0, tenant="a", enqueue_s=0.0, scheduled_s=0.5, first_token_s=1.0, completion_s=4.0,
                          output_tokens=4), "completed")
    _record(rec, _request(1, tenant="b", first_token_s=1.0, completion_s=2.0, output_tokens=5), "completed")
    by_tenant = _results(rec).summary()["latency_s_by_tenant"]
    assert by_tenant["a"]["queue_delay"]["mean"] == pytest.approx(0.5)
    assert by_tenant["a"]["tpot"]["mean"] == pytest.approx(1.0)
    assert by_tenant["b"]["queue_delay"]["mean"] == pytest.approx(0.0)
    assert by_tenant["b"]["tpot"]["mean"] == pytest.approx(0.25)


def test_latency_by_class_reports_none_for_a_class_with_no_completion():
    """A class whose only request was dropped is listed with None statistics."""
    rec = Recorder()
    _completed(rec, 0, 1.0, slo_class="gold")
    _record(rec, _request(1, slo_class="bronze", dropped_reason="slo_shed"), "dropped")
    by_class = _results(rec).summary()["latency_s_by_class"]
    assert by_class["bronze"]["e2e"] == {"mean": None, "p50": None, "p90": None, "p95": None, "p99": None}


# --- engine -----------------------------------------------------------------
def test_gpu_utilization_is_busy_seconds_over_duration():
    """Replica 0 busy 20 x 0.1 s, replica 1 busy 5 x 0.2 s, over 4 s: 0.5 and 0.25, mean 0.375."""
    rec = Recorder(num_replicas=2)
    rec.on_steps(0, 0.1, 20, 1, 0, 1, 0.0)
    rec.on_steps(1, 0.2, 5, 1, 0, 1, 0.0)
    util = _results(rec, end_s=4.0).summary()["gpu_utilization"]
    assert util["per_replica"] == [pytest.approx(0.5), pytest.approx(0.25)]
    assert util["mean"] == pytest.approx(0.375)
    assert "by_group" not in util


def test_gpu_utilization_by_group_averages_the_group_replicas():
    """Groups (big, small, big) with utilizations 0.5, 0.25, 0.25: big 0.375, small 0.25."""
    rec = Recorder(num_replicas=3)
    rec.on_steps(0, 0.5, 4, 1, 0, 1, 0.0)
    rec.on_steps(1, 0.5, 2, 1, 0, 1, 0.0)
    rec.on_steps(2, 0.5, 2, 1, 0, 1, 0.0)
    util = _results(rec, end_s=4.0, replica_groups=["big", "small", "big"]).summary()["gpu_utilization"]
    assert util["by_group"] == {"big": pytest.approx(0.375), "small": pytest.approx(0.25)}


def test_preemptions_are_counted_by_mode():
    """Two recompute and one swap preemption are reported per mode, total 3."""
    rec = Recorder()
    req = _request(0)
    rec.on_preemption(req, 0, 1.0)
    rec.on_preemption(req, 0, 2.0, mode="swap")
    rec.on_preemption(req, 0, 3.0, mode="recompute")
    pre = _results(rec).summary()["preemptions"]
    assert pre["by_mode"] == {"recompute": 2, "swap": 1}
    assert pre["total"] == 3


def test_engine_summary_names_each_replica_group_when_given():
    """``engine.group`` lists the group per replica when replica groups are given, and is absent otherwise."""
    rec = Recorder(num_replicas=2)
    assert _results(rec, replica_groups=["a100", "h100"]).summary()["engine"]["group"] == ["a100", "h100"]
    assert "group" not in _results(rec).summary()["engine"]


def test_records_carry_the_replica_group_and_empty_for_unrouted_requests():
    """``replica_group`` is the group of the request's replica, empty for replica -1."""
    rec = Recorder(num_replicas=2)
    _completed(rec, 0, 1.0, replica=1)
    _record(rec, _request(1, replica=-1, dropped_reason="max_queue"), "dropped")
    _completed(rec, 2, 1.0, replica=0)
    frame = _results(rec, replica_groups=["a100", "h100"]).to_dataframe()
    assert frame["replica_group"].tolist() == ["h100", "", "a100"]


# --- time series ------------------------------------------------------------
def test_timeseries_is_sorted_and_has_kv_utilization_per_replica():
    """Samples come out sorted by (time, replica); kv_utilization divides by that replica's blocks."""
    rec = Recorder(num_replicas=2)
    rec.on_sample(0.5, 1, 3, 2, 25, True)
    rec.on_sample(0.0, 1, 0, 0, 0, False)
    rec.on_sample(0.5, 0, 1, 4, 40, True)
    rec.on_sample(0.0, 0, 2, 0, 0, False)
    ts = _results(rec, kv_blocks=[80, 50]).timeseries()
    assert list(ts.columns) == ["time_s", "replica", "waiting", "running", "kv_used_blocks", "kv_utilization", "busy"]
    assert ts[["time_s", "replica"]].values.tolist() == [[0.0, 0], [0.0, 1], [0.5, 0], [0.5, 1]]
    assert ts["waiting"].tolist() == [2, 0, 1, 3]
    assert ts["kv_utilization"].tolist() == [0.0, 0.0, 0.5, 0.5]
    assert ts["busy"].tolist() == [0, 0, 1, 1]


def test_timeseries_is_an_empty_frame_with_its_columns_when_not_sampled():
    """Without samples the frame is empty but has the documented columns."""
    ts = _results(Recorder()).timeseries()
    assert ts.empty
    assert list(ts.columns) == ["time_s", "replica", "waiting", "running", "kv_used_blocks", "kv_utilization", "busy"]


def test_save_writes_timeseries_csv_only_when_sampled(tmp_path):
    """``timeseries.csv`` is written for a sampled run and not for an unsampled one."""
    sampled = Recorder()
    sampled.on_sample(0.0, 0, 1, 2, 10, True)
    _results(sampled).save(tmp_path / "sampled")
    _results(Recorder()).save(tmp_path / "plain")
    written = pd.read_csv(tmp_path / "sampled" / "timeseries.csv")
    assert written.to_dict("records") == [
        {"time_s": 0.0, "replica": 0, "waiting": 1, "running": 2, "kv_used_blocks": 10, "kv_utilization": 0.1,
         "busy": 1}
    ]
    assert not (tmp_path / "plain" / "timeseries.csv").exists()


def test_save_writes_each_preemption_mode(tmp_path):
    """``preemptions.csv`` has a mode column with each preemption's mode (rows in request-id order)."""
    rec = Recorder()
    rec.on_preemption(_request(1), 0, 0.5)
    rec.on_preemption(_request(0), 0, 1.0, mode="swap")
    _results(rec).save(tmp_path)
    written = pd.read_csv(tmp_path / "preemptions.csv")
    assert written[["request_id", "mode"]].values.tolist() == [[0, "swap"], [1, "recompute"]]


def test_summary_is_strict_json():
    """The summary (with the new keys) serializes as JSON without a default hook and without NaN."""
    rec = Recorder(num_replicas=2)
    _completed(rec, 0, 1.0, tenant="a", cached_tokens=10)
    # Arriving later than the first request: the arrival window has a length, so its rates are numbers.
    _record(rec, _request(1, tenant="b", dropped_reason="max_queue", arrival_s=0.5), "dropped")
    rec.on_steps(0, 0.1, 3, 1, 0, 1, 0.3)
    rec.on_preemption(_request(2), 1, 0.5, mode="swap")
    text = json.dumps(_results(rec, replica_groups=["g", "g"]).summary(), allow_nan=False)
    assert json.loads(text)["prefix_cache"]["cached_tokens"] == 10


def test_saved_summary_is_strict_json_when_figures_are_nan(tmp_path):
    """Every request arriving at once leaves the arrival window without length, so the
    summary's windowed rates are NaN; ``summary.json`` writes them as null, so that a strict
    parser reads the file."""
    rec = Recorder(num_replicas=1)
    _completed(rec, 0, 1.0)
    _completed(rec, 1, 2.0)
    results = _results(rec)
    assert math.isnan(results.summary()["throughput"]["requests_per_s"])
    results.save(tmp_path)

    def refuse(token: str) -> None:
        raise AssertionError(f"summary.json holds {token}")

    saved = json.loads((tmp_path / "summary.json").read_text(), parse_constant=refuse)
    assert saved["throughput"]["requests_per_s"] is None
    assert saved["throughput"]["whole_run_requests_per_s"] == pytest.approx(2 / 10.0)
