"""simpy_llm.explore.capacity: bracketing, pruning, probe reuse, the cards and input errors.

Every probe is a single FIFO server with constant 40 ms service (mu = 25 requests/s,
``capacity._doctest_scenario``) over a few hundred to a few thousand requests.
"""

from __future__ import annotations

import json
import math

import pytest

from simpy_llm import ScenarioError
from simpy_llm.explore import capacity as cap
from simpy_llm.explore.capacity import (
    CapacityCard,
    ReplicaCard,
    SloCriterion,
    StabilityCriteria,
    max_stable_load,
    min_replicas,
)

SMALL = {"warmup_requests": 100, "measure_requests": 1500}


@pytest.fixture
def probe_log(monkeypatch):
    """Every setting simulated so far, as (load, replicas, seed) tuples."""
    log = []
    real = cap._run_probe

    def logged(scenario, overrides, **kw):
        p = real(scenario, overrides, **kw)
        log.append((p.load, p.replicas, p.seed))
        return p

    monkeypatch.setattr(cap.searches, "_run_probe", logged)  # where the searches look it up
    return log


def test_search_brackets_by_doubling_from_the_scenarios_load(probe_log):
    """Without low/high the search starts at the scenario's own load (10/s) and doubles
    until a probe fails (40/s), then closes the bracket to the tolerance around mu = 25."""
    card = max_stable_load(cap._doctest_scenario(), tolerance=0.05, **SMALL)
    loads = [load for load, _, _ in probe_log]
    assert loads[:3] == [10.0, 20.0, 40.0]
    assert card.upper_stable_load / card.max_stable_load - 1 <= 0.05
    assert 20.0 <= card.max_stable_load < 25.0 * 1.05
    assert card.bracketed


def test_search_halves_when_the_start_fails(probe_log):
    """A start above capacity is halved until a probe passes."""
    card = max_stable_load(cap._doctest_scenario(), low=100.0, tolerance=0.1, **SMALL)
    loads = [load for load, _, _ in probe_log]
    assert loads[:3] == [100.0, 50.0, 25.0] or loads[:2] == [100.0, 50.0]
    assert 50.0 in loads and card.max_stable_load < 50.0


def test_high_closes_the_bracket_without_doubling(probe_log):
    """With high given, the bracket is [low, high]: no load above high is probed."""
    card = max_stable_load(cap._doctest_scenario(), low=10.0, high=30.0, tolerance=0.05, **SMALL)
    assert max(load for load, _, _ in probe_log) == 30.0
    assert card.upper_stable_load <= 30.0


def test_no_load_is_probed_twice(probe_log):
    """Both searches (SLO, then stability) share their probes: every (load, seed) runs once."""
    max_stable_load(
        cap._doctest_scenario(), tolerance=0.05, criteria=StabilityCriteria(slo={"queue_delay_mean": 0.08}), **SMALL
    )
    assert len(probe_log) == len(set(probe_log))


def test_known_verdicts_are_inferred_by_monotonicity():
    """A load above a known unstable one is unstable, below a known passing one passes,
    without probing."""
    calls = []

    def probe(x, _ov):
        calls.append(x)
        raise AssertionError("no probe expected")

    prober = cap._Prober({}, {}, "k", [None], probe, progress=False)
    prober.verdicts = {10.0: (True, True), 30.0: (False, False)}
    assert prober(5.0) == (True, True)
    assert prober(40.0) == (False, False)
    assert prober.known(20.0) is None
    assert calls == []


def test_an_unstable_probe_stops_early():
    """At twice the capacity the probe stops once the backlog passes the pruning bound:
    it is pruned, judged unstable, and its simulated time is a fraction of the run's."""
    window = cap._window(100, 5000, None, None)
    criteria = StabilityCriteria(prune_backlog=50)
    data = cap._doctest_scenario()
    p = cap._run_probe(data, {**window.overrides(), "workload.aggregate_rate": 50.0}, load=50.0, replicas=None,
                       window=window, criteria=criteria)
    assert p.pruned and not p.stable and not p.meets_slo
    assert "pruned" in p.reason
    # 5100 arrivals at 50/s take ~102 s; a backlog of 50 builds at 25/s in ~2 s.
    assert p.sim_time_s < 20.0
    assert math.isnan(p.throughput_rps)


def test_a_stable_probe_measures_the_window():
    """Below capacity a probe is stable, measures the requested window and reports
    throughput close to the offered load, and a busy fraction and (one slot) batch
    occupancy close to rho."""
    window = cap._window(200, 4000, None, None)
    p = cap._run_probe(cap._doctest_scenario(), {**window.overrides(), "workload.aggregate_rate": 12.5}, load=12.5,
                       replicas=None, window=window, criteria=StabilityCriteria())
    assert p.stable and p.meets_slo and not p.pruned and p.reason == "ok"
    assert p.measured_requests == 4000
    assert p.throughput_rps == pytest.approx(12.5, rel=0.08)
    assert p.busy_fraction == pytest.approx(0.5, rel=0.08)
    assert p.batch_occupancy == pytest.approx(0.5, rel=0.08)
    assert p.latency_s["e2e_p50"] >= 0.04


def test_slo_targets_decide_the_goodput_limit():
    """A mean-queueing-delay SLO makes the max SLO-goodput load lower than the max stable
    load; without SLOs the two coincide."""
    with_slo = max_stable_load(cap._doctest_scenario(), tolerance=0.05,
                               criteria=StabilityCriteria(slo={"queue_delay_mean": 0.02}), **SMALL)
    assert with_slo.max_goodput_load < with_slo.max_stable_load
    assert all(p.stable for p in with_slo.probes if p.meets_slo)
    plain = max_stable_load(cap._doctest_scenario(), tolerance=0.05, **SMALL)
    assert plain.max_goodput_load == plain.max_stable_load


def test_several_seeds_must_all_pass(probe_log):
    """With two seeds each load runs under both while it passes; the card lists every run."""
    card = max_stable_load(cap._doctest_scenario(), low=10.0, high=40.0, tolerance=0.2, seeds=[1, 2], **SMALL)
    assert {seed for _, _, seed in probe_log} == {1, 2}
    assert (10.0, None, 1) in probe_log and (10.0, None, 2) in probe_log
    assert len(card.probes) == len(probe_log)


def test_card_frame_and_json_round_trip(tmp_path):
    """The card's frame has one row per probe sorted by load; to_dict is strict JSON and
    from_dict gives the same card back; save writes JSON, CSV, Markdown and PNG."""
    card = max_stable_load(cap._doctest_scenario(), tolerance=0.1,
                           criteria=StabilityCriteria(slo=["e2e_p99=0.5"]), **SMALL)
    frame = card.to_frame()
    assert len(frame) == len(card.probes)
    assert frame["load"].is_monotonic_increasing
    for column in ("stable", "meets_slo", "throughput_rps", "ttft_p99_s", "busy_fraction", "batch_occupancy", "tpot_inflation",
                   "slo:e2e_p99", "reason"):
        assert column in frame.columns
    text = json.dumps(card.to_dict(), allow_nan=False)
    again = CapacityCard.from_dict(json.loads(text))
    assert again.to_dict() == card.to_dict()
    assert again.max_stable_load == card.max_stable_load
    md = str(card)
    assert "max stable load" in md and "max SLO-goodput load" in md
    names = sorted(p.name for p in card.save(tmp_path))
    assert names == ["capacity.csv", "capacity.json", "capacity.md", "capacity.png"]


def test_min_replicas_finds_the_smallest_passing_fleet(probe_log):
    """At 40 requests/s (1.6 x one server's capacity) with a 20 ms mean queueing delay,
    one replica fails and the search settles on the fewest passing; every smaller count
    probed failed."""
    card = min_replicas(cap._doctest_scenario(), load=40.0,
                        criteria=StabilityCriteria(slo={"queue_delay_mean": 0.02}), **SMALL)
    assert card.min_replicas is not None and card.min_replicas >= 2
    by_n = {p.replicas: p.meets_slo for p in card.probes}
    assert by_n[card.min_replicas]
    assert all(not ok for n, ok in by_n.items() if n < card.min_replicas)
    assert probe_log[0][1] == 1
    again = ReplicaCard.from_dict(json.loads(json.dumps(card.to_dict(), allow_nan=False)))
    assert again.to_dict() == card.to_dict()
    assert "replicas needed" in str(card)


def test_min_replicas_gives_up_at_max_replicas():
    """A load no fleet up to max_replicas carries gives min_replicas None."""
    card = min_replicas(cap._doctest_scenario(), load=100.0, max_replicas=2, **SMALL)
    assert card.min_replicas is None
    assert sorted({p.replicas for p in card.probes}) == [1, 2]


def test_slo_target_parsing_and_errors():
    """SLO criteria parse METRIC_STAT[CLASS]=SECONDS and reject unknown metrics, statistics
    and non-positive targets with the allowed values."""
    assert SloCriterion.parse("queue_delay_mean=0.1").name == "queue_delay_mean"
    assert SloCriterion.parse("e2e_p99.9=3").statistic == "p99.9"
    with pytest.raises(ValueError, match="allowed: ttft, tpot"):
        SloCriterion.parse("itl_p99=0.1")
    with pytest.raises(ValueError, match="METRIC_STAT"):
        SloCriterion.parse("ttft=0.5")
    with pytest.raises(ValueError, match="not a number"):
        SloCriterion.parse("ttft_p99=fast")
    with pytest.raises(ValueError, match="> 0"):
        SloCriterion.parse("ttft_p99=0")
    with pytest.raises(ValueError, match=r"p0\.\.p100"):
        SloCriterion(metric="ttft", statistic="p101", target_s=1.0)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"tolerance": 0.0}, ValueError, "tolerance"),
        ({"tolerance": 1.5}, ValueError, "tolerance"),
        ({"low": -1.0}, ValueError, "low must be"),
        ({"low": 20.0, "high": 10.0}, ValueError, "must be above low"),
        ({"measure_requests": 1}, ValueError, "measure_requests"),
        ({"warmup_s": 1.0}, ValueError, "measure_s is required"),
        ({"measure_s": 10.0, "measure_requests": 10}, ValueError, "not both"),
        ({"seeds": []}, ValueError, "seeds is empty"),
        ({"seeds": [1.5]}, TypeError, "integers"),
        ({"criteria": {"ttft_p99": 1}}, TypeError, "StabilityCriteria"),
        ({"load_key": "serving.engine"}, ValueError, "no positive number"),
    ],
)
def test_bad_arguments_are_rejected_before_any_run(kwargs, error, match, probe_log):
    """Out-of-range bounds, tolerances, windows, seeds or criteria raise a clear error
    and simulate nothing."""
    with pytest.raises(error, match=match):
        max_stable_load(cap._doctest_scenario(), **kwargs)
    assert probe_log == []


def test_bad_scenario_keys_raise_scenario_errors():
    """An override naming an unknown key is the loader's ScenarioError, naming the key."""
    with pytest.raises(ScenarioError, match="no_such_key"):
        max_stable_load(cap._doctest_scenario(), overrides={"serving.no_such_key": 1}, **SMALL)
    with pytest.raises(TypeError, match="YAML path or a scenario mapping"):
        max_stable_load(42)


def test_criteria_validation():
    """Criteria reject out-of-range fractions and bounds, naming the field."""
    with pytest.raises(ValueError, match="max_drop_fraction"):
        StabilityCriteria(max_drop_fraction=1.5)
    with pytest.raises(ValueError, match="prune_backlog"):
        StabilityCriteria(prune_backlog=0)
    with pytest.raises(ValueError, match="min_goodput_fraction"):
        StabilityCriteria(min_goodput_fraction=-0.1)
    c = StabilityCriteria(slo={"ttft_p99[gold]": 0.5}, min_goodput_fraction=0.9)
    assert StabilityCriteria.from_dict(json.loads(json.dumps(c.to_dict()))) == c


def test_replica_verdicts_are_inferred_the_other_way():
    """For a replica count more is easier: above a passing count passes, below a failing one fails."""
    prober = cap._Prober({}, {}, "k", [None], lambda x, ov: None, progress=False, more_is_harder=False)
    prober.verdicts = {2: (False, False), 8: (True, True)}
    assert prober(1) == (False, False)
    assert prober(16) == (True, True)
    assert prober.known(4) is None


def test_a_stable_fleet_holding_hundreds_in_flight_is_not_pruned():
    """Quickstart at 60 requests/s holds about 200 requests in flight when stable (Little's
    law): the default pruning bound leaves room for them, and the replica search finds the
    count that keeps up (3) instead of pruning every probe."""
    card = min_replicas("scenarios/quickstart.yaml", load=60.0, warmup_requests=1000, measure_requests=2000)
    assert card.min_replicas == 3
    frame = card.to_frame().set_index("replicas")
    assert not frame.loc[3, "pruned"] and frame.loc[3, "stable"]
    assert frame.loc[1, "pruned"]  # a quarter of the probe in the system at once


def test_a_replicas_card_plot_says_its_axes_in_words_with_whole_replica_ticks():
    """The replicas card's plot labels its axes in words with units, and puts its replica ticks
    on whole numbers only."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    card = min_replicas(cap._doctest_scenario(), load=40.0,
                        criteria=StabilityCriteria(slo={"queue_delay_mean": 0.02}), **SMALL)
    ax = card.plot(ax=Figure().subplots(), metric="e2e_p99_s")
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("replicas", "E2E p99 (s)")
    assert all(float(t).is_integer() for t in ax.get_xticks())
