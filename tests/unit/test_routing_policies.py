"""Routing policies and scorers, on hand-built replica views (no simulation)."""

from __future__ import annotations

import itertools
import math
import zlib
from collections import Counter
from collections.abc import Callable, Sequence

import attrs
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.schema import PolicySpec
from simpy_llm.config.structure import build_policy
from simpy_llm.entities import Request
from simpy_llm.policies import (
    JoinIdleQueue,
    JoinShortestQueue,
    LeastKV,
    LeastLoaded,
    LeastOutstandingTokens,
    OutputPredictor,
    PowerOfD,
    PrefixAffinity,
    RandomRouting,
    RoundRobin,
    SemiClairvoyant,
    WeightedPowerOfD,
    WeightedScore,
    prefix_key,
    routing_policies,
    routing_scorers,
)
from simpy_llm.policies.routing import _sample_distinct


@attrs.define
class FakeReplica:
    """A replica view with every field the policies may read."""

    index: int = 0
    group: str = "g"
    capacity: float = 1.0
    outstanding_requests: int = 0
    outstanding_tokens: int = 0
    waiting_requests: int = 0
    running_requests: int = 0
    queued_prompt_tokens: int = 0
    kv_free_blocks: int = 100
    kv_total_blocks: int = 100
    kv_utilization: float = 0.0
    prefill_s_per_token: float = 1e-4
    hit_tokens: int = 0

    def prefix_hit_tokens(self, request: Request) -> int:
        return self.hit_tokens


def fleet(n: int, **columns: Sequence) -> list[FakeReplica]:
    """*n* fake replicas; each keyword gives one value per replica."""
    return [FakeReplica(index=i, **{k: v[i] for k, v in columns.items()}) for i in range(n)]


def req(id: int = 0, prompt: int = 100, output: int = 50, **kw) -> Request:
    return Request(id=id, client_id="c", prompt_tokens=prompt, output_tokens=output, arrival_s=0.0, **kw)


def rng(seed: int = 1) -> np.random.Generator:
    return np.random.default_rng(seed)


# --- the original three ------------------------------------------------------------


def test_round_robin_cycles_through_replicas() -> None:
    """round_robin returns 0, 1, ..., N-1 and starts over."""
    rr, view = RoundRobin(), fleet(3)
    assert [rr.choose(req(), view) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_loaded_picks_fewest_outstanding_with_ties_to_lowest_index() -> None:
    """least_loaded reads outstanding_requests only and breaks ties by the lowest index."""
    view = fleet(4, outstanding_requests=[3, 1, 1, 2], waiting_requests=[0, 9, 0, 0])
    assert LeastLoaded().choose(req(), view) == 1


@given(st.lists(st.integers(0, 6), min_size=1, max_size=9))
def test_least_loaded_is_the_first_position_of_the_fewest_outstanding(loads: list[int]) -> None:
    """least_loaded returns the first position holding the smallest outstanding_requests, for any loads."""
    view = fleet(len(loads), outstanding_requests=loads)
    assert LeastLoaded().choose(req(), view) == loads.index(min(loads))


def test_random_routing_is_reproducible_from_its_stream() -> None:
    """random draws from the injected generator: the same seed gives the same choices."""
    view = fleet(5)
    p, q = RandomRouting(rng=rng(3)), RandomRouting(rng=rng(3))
    picks = [p.choose(req(), view) for _ in range(50)]
    assert picks == [q.choose(req(), view) for _ in range(50)]
    assert set(picks) == set(range(5))


# --- jsq / jiq ---------------------------------------------------------------------


def test_jsq_picks_fewest_waiting_plus_running() -> None:
    """jsq minimises waiting + running, not outstanding."""
    view = fleet(3, waiting_requests=[0, 2, 1], running_requests=[4, 1, 1], outstanding_requests=[0, 9, 9])
    assert JoinShortestQueue().choose(req(), view) == 2


def test_jsq_ties_go_to_the_lowest_index() -> None:
    """Among replicas with equal waiting + running, jsq picks the lowest index."""
    view = fleet(4, waiting_requests=[1, 0, 2, 0], running_requests=[1, 2, 0, 3])
    assert JoinShortestQueue().choose(req(), view) == 0


def test_jiq_picks_only_idle_replicas_and_spreads_over_them() -> None:
    """With idle replicas, jiq picks one of them, each idle one sometimes, and never a busy one."""
    view = fleet(5, outstanding_requests=[2, 0, 1, 0, 0])
    policy = JoinIdleQueue(rng=rng())
    picks = Counter(policy.choose(req(), view) for _ in range(300))
    assert set(picks) == {1, 3, 4}


def test_jiq_without_idle_replicas_falls_back_to_uniform_random() -> None:
    """With no idle replica, jiq picks uniformly among all (chi-square, fixed seed)."""
    view = fleet(4, outstanding_requests=[1, 2, 3, 4])
    policy = JoinIdleQueue(rng=rng(7))
    counts = Counter(policy.choose(req(), view) for _ in range(4000))
    assert stats.chisquare([counts[i] for i in range(4)]).pvalue > 1e-3


# --- power of d ----------------------------------------------------------------------


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=8), st.integers(0, 3))
def test_power_of_d_with_d_at_least_n_is_jsq_and_draws_nothing(loads: list[tuple[int, int]], extra: int) -> None:
    """With d >= N, power_of_d chooses exactly as jsq and leaves the random stream untouched."""
    view = [FakeReplica(index=i, waiting_requests=w, running_requests=r) for i, (w, r) in enumerate(loads)]
    g = rng(5)
    before = g.bit_generator.state
    assert PowerOfD(d=len(view) + extra, rng=g).choose(req(), view) == JoinShortestQueue().choose(req(), view)
    assert g.bit_generator.state == before


def test_power_of_2_never_picks_the_unique_longest_queue() -> None:
    """Any two distinct replicas include a shorter one, so JSQ(2) never picks the unique longest queue."""
    view = fleet(3, waiting_requests=[1, 6, 2])
    policy = PowerOfD(d=2, rng=rng())
    assert 1 not in {policy.choose(req(), view) for _ in range(500)}


def test_power_of_d_breaks_ties_uniformly() -> None:
    """With all queues equal, ties go to the replica sampled first, so every replica is equally likely."""
    view = fleet(5, waiting_requests=[2] * 5)
    policy = PowerOfD(d=2, rng=rng(11))
    counts = Counter(policy.choose(req(), view) for _ in range(5000))
    assert stats.chisquare([counts[i] for i in range(5)]).pvalue > 1e-3


def test_sample_distinct_is_uniform_over_ordered_samples() -> None:
    """The sampler gives d distinct indices; all N!/(N-d)! ordered samples are equally likely (chi-square)."""
    g = rng(2)
    samples = [tuple(_sample_distinct(g, 4, 2)) for _ in range(6000)]
    assert all(a != b for a, b in samples)
    counts = Counter(samples)
    ordered = list(itertools.permutations(range(4), 2))
    assert set(counts) == set(ordered)
    assert stats.chisquare([counts[p] for p in ordered]).pvalue > 1e-3


def test_power_of_d_is_reproducible_from_its_stream() -> None:
    """Two power_of_d routers on equally seeded streams make identical choices."""
    view = fleet(6, waiting_requests=[3, 1, 4, 1, 5, 9])
    a, b = PowerOfD(d=3, rng=rng(8)), PowerOfD(d=3, rng=rng(8))
    assert [a.choose(req(), view) for _ in range(100)] == [b.choose(req(), view) for _ in range(100)]


def _exact_mean_max_load(n: int, m: int, step: Callable[[tuple[int, ...]], dict[tuple[int, ...], float]]) -> float:
    """E[max load] after *m* balls, by exact propagation of the distribution over sorted load vectors."""
    dist = {tuple([0] * n): 1.0}
    for _ in range(m):
        nxt: dict[tuple[int, ...], float] = {}
        for state, p in dist.items():
            for s2, q in step(state).items():
                nxt[s2] = nxt.get(s2, 0.0) + p * q
        dist = nxt
    return sum(p * max(s) for s, p in dist.items())


def _add(state: tuple[int, ...], i: int) -> tuple[int, ...]:
    s = list(state)
    s[i] += 1
    return tuple(sorted(s))


def _random_step(state: tuple[int, ...]) -> dict[tuple[int, ...], float]:
    out: dict[tuple[int, ...], float] = {}
    for i in range(len(state)):
        s2 = _add(state, i)
        out[s2] = out.get(s2, 0.0) + 1 / len(state)
    return out


def _jsq2_step(state: tuple[int, ...]) -> dict[tuple[int, ...], float]:
    pairs = list(itertools.combinations(range(len(state)), 2))
    out: dict[tuple[int, ...], float] = {}
    for a, b in pairs:  # on a tie either choice gives the same sorted state
        s2 = _add(state, a if state[a] <= state[b] else b)
        out[s2] = out.get(s2, 0.0) + 1 / len(pairs)
    return out


def _simulated_max_loads(policy, n: int, m: int, trials: int) -> np.ndarray:
    out = np.empty(trials)
    for t in range(trials):
        view = fleet(n)
        for _ in range(m):
            view[policy.choose(req(), view)].waiting_requests += 1
        out[t] = max(r.waiting_requests for r in view)
    return out


@pytest.mark.parametrize(
    ("make", "step"),
    [(lambda g: RandomRouting(rng=g), _random_step), (lambda g: PowerOfD(d=2, rng=g), _jsq2_step)],
    ids=["random", "power_of_2"],
)
def test_balls_into_bins_max_load_matches_the_exact_expectation(make, step) -> None:
    """8 requests on 4 replicas with no departures: the mean maximum queue matches the exact value.

    The exact expectation comes from propagating the distribution of sorted
    loads; the tolerance is 4 standard errors of the sample mean.
    """
    n, m, trials = 4, 8, 3000
    exact = _exact_mean_max_load(n, m, step)
    sample = _simulated_max_loads(make(rng(21)), n, m, trials)
    se = sample.std(ddof=1) / math.sqrt(trials)
    assert abs(sample.mean() - exact) < 4 * se


def test_power_of_2_balances_better_than_random_exactly() -> None:
    """The exact expected maximum load of JSQ(2) is well below random's on the same toy."""
    random_max = _exact_mean_max_load(4, 8, _random_step)
    jsq2_max = _exact_mean_max_load(4, 8, _jsq2_step)
    assert jsq2_max < random_max - 0.5


# --- weighted power of d ---------------------------------------------------------------


def test_weighted_power_of_1_picks_in_proportion_to_capacity() -> None:
    """With d = 1 the single draw is proportional to capacity (chi-square against 1:2:5)."""
    caps = [1.0, 2.0, 5.0]
    view = fleet(3, capacity=caps)
    policy = WeightedPowerOfD(d=1, rng=rng(4))
    counts = Counter(policy.choose(req(), view) for _ in range(8000))
    expected = [8000 * c / sum(caps) for c in caps]
    assert stats.chisquare([counts[i] for i in range(3)], expected).pvalue > 1e-3


def test_weighted_power_of_d_minimises_drain_time_per_capacity() -> None:
    """Comparing every replica (d >= N), it picks the smallest (waiting + running + 1) / capacity."""
    view = fleet(3, waiting_requests=[0, 4, 2], running_requests=[1, 1, 1], capacity=[1.0, 4.0, 1.0])
    assert WeightedPowerOfD(d=3, rng=rng()).choose(req(), view) == 1  # 2/1, 6/4, 4/1


def test_weighted_power_of_d_samples_distinct_replicas() -> None:
    """d = 2 of 3 draws two distinct replicas, so the worst one is never picked, however often it is drawn.

    Replica 1 is drawn first almost always (capacity 30 of 32) and scores
    101 / 30 > 2 / 1; drawing it twice would pick it.
    """
    view = fleet(3, waiting_requests=[1, 100, 1], capacity=[1.0, 30.0, 1.0])
    policy = WeightedPowerOfD(d=2, rng=rng(6))
    assert 1 not in {policy.choose(req(), view) for _ in range(500)}


# --- token and KV based -------------------------------------------------------------------


def test_least_outstanding_tokens_divides_by_capacity() -> None:
    """The smallest outstanding_tokens / capacity wins, even with more tokens on a faster replica."""
    view = fleet(3, outstanding_tokens=[300, 500, 200], capacity=[1.0, 4.0, 1.0])
    assert LeastOutstandingTokens().choose(req(), view) == 1


def test_least_outstanding_tokens_ties_go_to_the_lowest_index() -> None:
    """Equal token pressure: the lowest index."""
    view = fleet(3, outstanding_tokens=[400, 200, 200], capacity=[1.0, 1.0, 1.0])
    assert LeastOutstandingTokens().choose(req(), view) == 1


def test_least_kv_prefers_the_largest_free_fraction() -> None:
    """least_kv compares free / total blocks, not free blocks."""
    view = fleet(3, kv_free_blocks=[50, 60, 30], kv_total_blocks=[100, 200, 40])
    assert LeastKV().choose(req(), view) == 2


def test_least_kv_ties_go_to_fewest_outstanding_then_lowest_index() -> None:
    """Equal free fractions: fewest outstanding requests, then the lowest index."""
    view = fleet(4, kv_free_blocks=[10, 20, 20, 10], kv_total_blocks=[20] * 4, outstanding_requests=[5, 3, 3, 0])
    assert LeastKV().choose(req(), view) == 1


# --- prefix affinity ---------------------------------------------------------------------------


def test_prefix_key_prefers_blocks_then_session_then_none() -> None:
    """The key is the first prefix block, else the CRC-32 of the session id, else None."""
    assert prefix_key(req(prefix_blocks=(7, 8), session_id="s")) == 7
    assert prefix_key(req(session_id="s")) == zlib.crc32(b"s")
    assert prefix_key(req()) is None


def test_prefix_affinity_ring_is_the_same_in_every_process() -> None:
    """Ring positions come from a fixed 64-bit hash, so a key's home replica is a pinned constant."""
    homes = [PrefixAffinity().replica_for_key(key, [0] * 8) for key in range(6)]
    assert homes == PINNED_HOMES


PINNED_HOMES = [6, 3, 2, 1, 0, 5]


def test_prefix_affinity_keeps_a_key_on_one_replica_while_under_the_bound() -> None:
    """Repeated requests of one prefix go to one replica while its load stays within the bound."""
    policy = PrefixAffinity(load_bound=1.0)
    view = fleet(4, outstanding_requests=[2, 2, 2, 2])
    r = req(prefix_blocks=(12345,))
    home = policy.choose(r, view)
    for _ in range(3):  # bound: ceil(2 * (T + 1) / 4) stays >= the home's load here
        view[home].outstanding_requests += 1
        assert policy.choose(r, view) == home


def test_prefix_affinity_spills_when_over_the_bound_and_returns_when_under() -> None:
    """Over the bound a key moves to the next replica on the ring (always the same one).

    It comes back when the home's load drops within the bound again.
    """
    policy = PrefixAffinity(load_bound=0.0)
    r = req(session_id="chat-1")
    home = policy.choose(r, fleet(4))
    loads = [1, 1, 1, 1]
    loads[home] = 4  # bound = ceil((7 + 1) / 4) = 2 < 4
    spill = policy.choose(r, fleet(4, outstanding_requests=loads))
    assert spill != home
    assert policy.choose(r, fleet(4, outstanding_requests=loads)) == spill
    loads[home] = 2  # bound = ceil(6 / 4) = 2: the home accepts again
    assert policy.choose(r, fleet(4, outstanding_requests=loads)) == home


@given(st.lists(st.integers(0, 30), min_size=1, max_size=10), st.integers(0, 2**63), st.sampled_from([0.0, 0.25, 1.0]))
def test_prefix_affinity_never_picks_a_replica_over_the_bound(loads: list[int], key: int, eps: float) -> None:
    """The chosen replica's load is at most ceil((1 + epsilon) * (total + 1) / N)."""
    policy = PrefixAffinity(load_bound=eps, virtual_nodes=5)
    i = policy.replica_for_key(key, loads)
    assert loads[i] <= math.ceil((1 + eps) * (sum(loads) + 1) / len(loads))


def test_prefix_affinity_spreads_keys_over_replicas() -> None:
    """With 100 virtual nodes each of 4 replicas is home to 15-35% of 4000 keys."""
    policy = PrefixAffinity()
    counts = Counter(policy.replica_for_key(k * 7919, [0] * 4) for k in range(4000))
    assert all(600 <= counts[i] <= 1400 for i in range(4))


def test_prefix_affinity_without_a_key_is_least_loaded() -> None:
    """A request with neither prefix blocks nor a session goes to the least-loaded replica."""
    view = fleet(3, outstanding_requests=[4, 1, 2])
    assert PrefixAffinity().choose(req(), view) == 1


# --- semi-clairvoyant -----------------------------------------------------------------------------


class CountingPredictor:
    """Returns fixed predictions by request id and records which requests it was asked about."""

    def __init__(self, by_id: dict[int, float]) -> None:
        self.by_id = by_id
        self.asked: list[int] = []

    def predict(self, request: Request) -> float:
        self.asked.append(request.id)
        return self.by_id[request.id]


def _route(policy, view: list[FakeReplica], r: Request) -> int:
    """Route *r* and update the router-local counts as the simulation would."""
    i = policy.choose(r, view)
    view[i].outstanding_requests += 1
    view[i].outstanding_tokens += r.prompt_tokens
    return i


def test_semi_clairvoyant_steers_around_predicted_long_work() -> None:
    """After a predicted-long request lands on a replica, short ones go elsewhere until work evens out."""
    policy = SemiClairvoyant(predictor=OutputPredictor(kind="oracle"))
    view = fleet(2)
    assert _route(policy, view, req(0, prompt=10, output=1000)) == 0
    assert [_route(policy, view, req(i, prompt=10, output=100)) for i in range(1, 6)] == [1] * 5


def test_semi_clairvoyant_asks_the_predictor_only_about_the_new_request() -> None:
    """Each choice asks the predictor once, about the request being routed."""
    predictor = CountingPredictor({0: 5.0, 1: 7.0, 2: 9.0})
    policy = SemiClairvoyant(predictor=predictor)
    view = fleet(3)
    for i in range(3):
        _route(policy, view, req(i))
    assert predictor.asked == [0, 1, 2]


def test_semi_clairvoyant_ledger_drops_smallest_predictions_on_completions() -> None:
    """When a replica's outstanding count falls, the ledger forgets its smallest predictions."""
    predictor = CountingPredictor({0: 500.0, 1: 20.0, 2: 300.0, 3: 1.0})
    policy = SemiClairvoyant(predictor=predictor)
    view = fleet(1)
    for i in range(3):
        _route(policy, view, req(i))
    assert policy.ledger_output_tokens() == [820.0]
    view[0].outstanding_requests -= 1  # one finished
    _route(policy, view, req(3))
    assert policy.ledger_output_tokens() == [801.0]  # 500 + 300 kept, 1 added


def test_semi_clairvoyant_sends_work_to_the_faster_replica_when_pressure_is_equal() -> None:
    """With equal outstanding work, the new request's own predicted work makes the faster replica win."""
    policy = SemiClairvoyant(predictor=OutputPredictor(kind="oracle"))
    view = fleet(2, capacity=[1.0, 2.0], outstanding_requests=[1, 1], outstanding_tokens=[100, 200])
    # unknown outstanding counts at the mean prediction (this request's, 50): 150 + 150 vs (250 + 150) / 2
    assert policy.choose(req(0, prompt=100, output=50), view) == 1


def test_semi_clairvoyant_ties_go_to_fewest_outstanding_then_lowest_index() -> None:
    """Equal finish pressure: fewer outstanding requests, then the lowest index."""
    policy = SemiClairvoyant(predictor=OutputPredictor(kind="oracle"), output_weight=0.0)
    view = fleet(3, outstanding_tokens=[100, 100, 100], outstanding_requests=[3, 1, 1])
    assert policy.choose(req(), view) == 1


# --- weighted score ---------------------------------------------------------------------------------


def test_queue_scorer_is_min_max_normalised() -> None:
    """queue: 1 for the fewest waiting, 0 for the most, linear between; all 1 when equal."""
    view = fleet(3, waiting_requests=[2, 6, 4])
    assert routing_scorers.get("queue")(req(), view) == [1.0, 0.0, 0.5]
    assert routing_scorers.get("queue")(req(), fleet(2, waiting_requests=[3, 3])) == [1.0, 1.0]


def test_builtin_scorers_give_the_documented_values() -> None:
    """load, kv, prefix and capacity map to [0, 1] as documented."""
    view = fleet(
        3,
        outstanding_requests=[0, 1, 3],
        kv_utilization=[0.25, 1.0, 0.0],
        hit_tokens=[0, 50, 200],
        capacity=[1.0, 2.0, 4.0],
    )
    r = req(prompt=100)
    assert routing_scorers.get("load")(r, view) == [1.0, 0.5, 0.25]
    assert routing_scorers.get("kv")(r, view) == [0.75, 0.0, 1.0]
    assert routing_scorers.get("prefix")(r, view) == [0.0, 0.5, 1.0]
    assert routing_scorers.get("capacity")(r, view) == [0.25, 0.5, 1.0]
    assert routing_scorers.get("prefix")(req(prompt=0), view) == [0.0, 0.0, 0.0]


def test_weighted_score_adds_weighted_scores_and_picks_the_maximum() -> None:
    """The total is the weighted sum; prefix weight 3 outweighs a full queue score of weight 1."""
    view = fleet(2, waiting_requests=[0, 5], hit_tokens=[0, 100])
    policy = WeightedScore(scorers={"queue": 1.0, "prefix": 3.0})
    assert policy.scores(req(prompt=100), view) == [1.0, 3.0]
    assert policy.choose(req(prompt=100), view) == 1


def test_weighted_score_ties_go_to_the_lowest_index() -> None:
    """Equal totals: the lowest index."""
    view = fleet(3, waiting_requests=[4, 1, 1])
    assert WeightedScore(scorers={"queue": 1.0}).choose(req(), view) == 1


def test_weighted_score_unknown_scorer_names_the_key_and_lists_known_ones() -> None:
    """An unknown scorer is an error at scorers.<name> listing the registered scorers."""
    with pytest.raises(FieldValueError) as info:
        WeightedScore(scorers={"queue": 1.0, "latency": 2.0})
    assert info.value.field == "scorers.latency"
    assert "capacity, kv, load, prefix, queue" in info.value.message


def test_weighted_score_uses_a_user_registered_scorer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scorer registered by the user is accepted by name and counts in the total."""
    monkeypatch.setattr(routing_scorers, "_items", dict(routing_scorers._items))

    @routing_scorers.register("last")
    def last(request, view):
        return [1.0 if i == len(view) - 1 else 0.0 for i in range(len(view))]

    assert WeightedScore(scorers={"last": 1.0, "queue": 0.5}).choose(req(), fleet(3)) == 2


# --- all of them --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", routing_policies.names())
def test_every_builtin_router_builds_from_empty_params_and_chooses_a_replica(kind: str) -> None:
    """Each registered policy builds from {kind: NAME} with the injected rng and returns a valid index."""
    policy = build_policy(PolicySpec(kind=kind), routing_policies, rng=rng())
    view = fleet(4, outstanding_requests=[1, 0, 2, 1], waiting_requests=[1, 0, 1, 2], kv_utilization=[0.5] * 4)
    for i in range(20):
        assert 0 <= policy.choose(req(i, session_id=f"s{i % 3}"), view) < 4
