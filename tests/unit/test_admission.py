"""Admission policies, on hand-built replica views (no simulation)."""

from __future__ import annotations

import attrs
import pytest

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.schema import PolicySpec
from simpy_llm.config.structure import build_policy
from simpy_llm.entities import Request
from simpy_llm.policies import (
    AlwaysAdmit,
    MaxQueue,
    SloShed,
    TokenBucket,
    admission_policies,
    predicted_ttft_s,
)


@attrs.define
class FakeReplica:
    """The view fields admission policies read."""

    waiting_requests: int = 0
    queued_prompt_tokens: int = 0
    prefill_s_per_token: float = 1e-3
    hit_tokens: int = 0

    def prefix_hit_tokens(self, request: Request) -> int:
        return self.hit_tokens


def req(tenant: str = "t", prompt: int = 100, slo_class: str = "default", id: int = 0) -> Request:
    return Request(
        id=id, client_id=tenant, prompt_tokens=prompt, output_tokens=10, arrival_s=0.0, slo_class=slo_class
    )


def test_registry_holds_the_builtin_admission_policies() -> None:
    """The four built-ins are registered under their documented names."""
    assert admission_policies.names() == ["always", "max_queue", "slo_shed", "token_bucket"]


def test_always_admits_even_with_full_queues() -> None:
    """always returns None whatever the view says."""
    assert AlwaysAdmit().admit(req(), [FakeReplica(waiting_requests=10**6)], 5.0) is None


# --- max_queue ---------------------------------------------------------------------------


def test_max_queue_rejects_at_the_fleet_limit_and_admits_below() -> None:
    """Fleet-wide: rejected with 'max_queue' once the total waiting reaches max_waiting."""
    policy = MaxQueue(max_waiting=5)
    assert policy.admit(req(), [FakeReplica(waiting_requests=2), FakeReplica(waiting_requests=2)], 0.0) is None
    assert policy.admit(req(), [FakeReplica(waiting_requests=2), FakeReplica(waiting_requests=3)], 0.0) == "max_queue"


def test_max_queue_per_replica_rejects_only_when_every_queue_is_full() -> None:
    """per_replica: one replica with room is enough to admit."""
    policy = MaxQueue(max_waiting=3, per_replica=True)
    assert policy.admit(req(), [FakeReplica(waiting_requests=9), FakeReplica(waiting_requests=2)], 0.0) is None
    assert policy.admit(req(), [FakeReplica(waiting_requests=9), FakeReplica(waiting_requests=3)], 0.0) == "max_queue"


def test_max_queue_requires_a_positive_limit() -> None:
    """max_waiting below 1 would reject everything and is an error at its key."""
    with pytest.raises(FieldValueError, match="max_waiting"):
        MaxQueue(max_waiting=0)


# --- token_bucket --------------------------------------------------------------------------


def test_token_bucket_starts_full_and_refills_continuously() -> None:
    """Exact arithmetic (binary fractions): full start, continuous refill at rate, capped at burst."""
    tb = TokenBucket(rate=0.5, burst=2.0)
    a = req("a")
    assert [tb.admit(a, [], 0.0), tb.admit(a, [], 0.0)] == [None, None]
    assert tb.level("a") == 0.0
    assert tb.admit(a, [], 1.0) == "token_bucket"  # 0.5 < 1
    assert tb.level("a") == 0.5
    assert tb.admit(a, [], 2.0) is None  # 0.5 + 0.5 = 1, spent
    assert tb.level("a") == 0.0
    assert tb.admit(a, [], 100.0) is None  # refill capped at 2, then 1 spent
    assert tb.level("a") == 1.0


def test_token_bucket_rejection_takes_nothing() -> None:
    """A rejected request leaves its bucket's level unchanged (apart from the refill)."""
    tb = TokenBucket(rate=0.25, burst=1.0, unit="tokens")
    assert tb.admit(req("a", prompt=1), [], 0.0) is None
    assert tb.admit(req("a", prompt=1), [], 2.0) == "token_bucket"  # 0.5 < 1
    assert tb.level("a") == 0.5
    assert tb.admit(req("a", prompt=1), [], 4.0) is None  # 0.5 + 0.5, not 0.5 left after a charge


def test_token_bucket_buckets_are_per_tenant() -> None:
    """One tenant emptying its bucket does not limit another."""
    tb = TokenBucket(rate=1.0, burst=1.0)
    assert tb.admit(req("a"), [], 0.0) is None
    assert tb.admit(req("a"), [], 0.0) == "token_bucket"
    assert tb.admit(req("b"), [], 0.0) is None


def test_token_bucket_tokens_charge_exactly() -> None:
    """unit: tokens: admitted while the level covers the prompt, rejected once it does not."""
    tb = TokenBucket(rate=100.0, burst=1000.0, unit="tokens")
    assert tb.admit(req(prompt=600), [], 0.0) is None
    assert tb.level("t") == 400.0
    assert tb.admit(req(prompt=600), [], 1.0) == "token_bucket"
    assert tb.level("t") == 500.0
    assert tb.admit(req(prompt=600), [], 2.0) is None
    assert tb.level("t") == 0.0
    assert TokenBucket(rate=1e6, burst=1000.0, unit="tokens").admit(req(prompt=1001), [], 0.0) == "token_bucket"


def test_token_bucket_does_not_refund_time_running_backwards() -> None:
    """A decision at an earlier time than the last one adds nothing to the bucket."""
    tb = TokenBucket(rate=1.0, burst=4.0)
    for _ in range(4):
        tb.admit(req(), [], 10.0)
    assert tb.admit(req(), [], 5.0) == "token_bucket"
    assert tb.level("t") == 0.0


# --- slo_shed ---------------------------------------------------------------------------------


def test_predicted_ttft_counts_queued_prefill_plus_the_uncached_prompt() -> None:
    """(queued + prompt - prefix hits) x prefill seconds per token."""
    replica = FakeReplica(queued_prompt_tokens=3000, prefill_s_per_token=0.5**10, hit_tokens=1024)
    assert predicted_ttft_s(req(prompt=2048), replica) == (3000 + 1024) / 1024


def test_slo_shed_sheds_when_even_the_best_replica_misses() -> None:
    """Shed with 'slo_shed' when every replica's estimate exceeds the class target."""
    view = [FakeReplica(queued_prompt_tokens=900), FakeReplica(queued_prompt_tokens=1400)]
    policy = SloShed(slo={"chat": 0.9})
    assert policy.admit(req(prompt=100, slo_class="chat"), view, 0.0) == "slo_shed"  # best: 1.0 s


def test_slo_shed_admits_when_some_replica_can_make_it() -> None:
    """One replica whose estimate is within the target is enough (equality admits)."""
    view = [FakeReplica(queued_prompt_tokens=5000), FakeReplica(queued_prompt_tokens=0, prefill_s_per_token=0.25)]
    assert SloShed(slo={"chat": 1.0}).admit(req(prompt=4, slo_class="chat"), view, 0.0) is None


def test_slo_shed_credits_prefix_cache_hits() -> None:
    """Prompt tokens in the prefix cache need no prefill, so a cached prompt can be admitted."""
    view = [FakeReplica(queued_prompt_tokens=0, prefill_s_per_token=0.01)]
    policy = SloShed(slo={"chat": 1.0})
    assert policy.admit(req(prompt=150, slo_class="chat"), view, 0.0) == "slo_shed"
    view[0].hit_tokens = 100
    assert policy.admit(req(prompt=150, slo_class="chat"), view, 0.0) is None


def test_slo_shed_never_sheds_a_class_without_a_target() -> None:
    """Classes missing from the targets are always admitted."""
    view = [FakeReplica(queued_prompt_tokens=10**9)]
    assert SloShed(slo={"chat": 0.1}).admit(req(slo_class="batch"), view, 0.0) is None
    assert SloShed().admit(req(slo_class="chat"), view, 0.0) is None


def test_slo_targets_are_injected_not_configured() -> None:
    """build_policy injects slo; a scenario's params may not set it."""
    policy = build_policy(PolicySpec(kind="slo_shed"), admission_policies, slo={"chat": 0.5})
    assert isinstance(policy, SloShed) and policy.slo == {"chat": 0.5}
    with pytest.raises(FieldValueError, match="set by the simulation"):
        build_policy(PolicySpec(kind="slo_shed", params={"slo": {"chat": 9.0}}), admission_policies, slo={})


@pytest.mark.parametrize(
    ("kind", "params"),
    [("always", {}), ("max_queue", {"max_waiting": 8, "per_replica": True}),
     ("token_bucket", {"rate": 2.0, "burst": 1000, "unit": "tokens"}), ("slo_shed", {})],
)
def test_builtins_build_from_scenario_params(kind: str, params: dict) -> None:
    """Each built-in is structured from its documented parameters."""
    policy = build_policy(PolicySpec(kind=kind, params=params), admission_policies, slo={})
    assert policy.admit(req(), [FakeReplica()], 0.0) is None


def test_token_bucket_rejects_an_unknown_unit() -> None:
    """unit is requests or tokens; anything else is an error naming the key."""
    with pytest.raises(FieldValueError, match="unit"):
        TokenBucket(rate=1.0, burst=1.0, unit="bytes")
