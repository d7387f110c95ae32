"""Flow control in front of the router (``serving.gateway``, ``docs/gateway.md``): requests
wait in ordered sub-queues while every replica is saturated, and go on as requests end."""

from __future__ import annotations

import re

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm import Simulation
from simpy_llm.config import ScenarioError
from simpy_llm.config.gateway import GatewayConfig
from simpy_llm.entities import Request
from simpy_llm.loading import scenario_from_dict
from simpy_llm.metrics.recorder import Recorder
from simpy_llm.policies.gateway import Fifo
from simpy_llm.serving.gateway import Gateway
from simpy_llm.wire import Wire


def _client(cid: str, *, tenant: str = "", priority: int = 0, fraction: float = 1.0) -> dict:
    return {
        "id": cid, "tenant_id": tenant or cid, "priority": priority, "rate_fraction": fraction,
        "arrival": {"process": "constant"},
        "input_distribution": {"type": "constant", "params": {"value": 200}},
        "output_distribution": {"type": "constant", "params": {"value": 20}},
    }


def _scenario(gateway: dict | None, clients: list[dict], *, n: int = 12, rate: float = 1000.0, replicas: int = 1) -> dict:
    data = {
        "seed": 3,
        "workload": {"aggregate_rate": rate, "num_requests": n, "clients": clients},
        "serving": {"replicas": replicas, "latency_model": {
            "kind": "blis_linear", "params": {"beta0_us": 1000.0, "beta1_us": 10.0, "beta2_us": 100.0}}},
    }
    if gateway is not None:
        data["serving"]["gateway"] = gateway
    return data


def _run(data: dict):
    return Simulation(scenario_from_dict(data)).run(progress=False)


def test_one_request_at_a_time_serialises_the_burst():
    """With one replica and room for one request, a burst of 12 arriving within 12 ms runs one
    request at a time: each starts when the one before ends (its first scheduling at the
    previous completion) and lasts what a lone request lasts (the first one's service)."""
    frame = _run(_scenario({"max_outstanding_per_replica": 1, "queue_by": "none"}, [_client("c")])).to_dataframe()
    frame = frame.sort_values("first_scheduled_s")
    service = frame["completion_s"].iloc[0] - frame["first_scheduled_s"].iloc[0]
    starts, ends = frame["first_scheduled_s"].to_numpy(), frame["completion_s"].to_numpy()
    assert starts[1:] == pytest.approx(ends[:-1], abs=1e-9)
    assert ends - starts == pytest.approx([service] * 12, abs=1e-9)


def test_without_a_gateway_the_burst_shares_the_batch():
    """The same burst without a gateway is batched: the requests overlap (the check above is
    the gateway's doing)."""
    frame = _run(_scenario(None, [_client("c")])).to_dataframe().sort_values("first_scheduled_s")
    assert frame["first_scheduled_s"].iloc[1] < frame["completion_s"].iloc[0]


def test_strict_priority_serves_the_higher_class_first():
    """Two clients alternate in a burst; with priority dispatch every waiting high-priority
    request is dispatched before any waiting low-priority one."""
    data = _scenario({"max_outstanding_per_replica": 1, "queue_by": "priority", "dispatch": {"kind": "priority"}},
                     [_client("low", priority=0), _client("high", priority=5)], n=12)
    frame = _run(data).to_dataframe().sort_values("first_scheduled_s")
    order = frame["client_id"].tolist()
    first = order[0]  # the first arrival passes straight through
    rest = order[1:]
    assert rest == sorted(rest, key=lambda c: c != "high"), (first, order)


def test_weighted_fair_dispatch_follows_the_weights():
    """Two tenants each send 12 requests in a burst; with weights 3:1 the dispatches after the
    first follow weighted round robin: 3 of every 4 to the heavier tenant while both wait."""
    data = _scenario({"max_outstanding_per_replica": 1, "dispatch": {"kind": "fair", "params": {"weights": {"gold": 3}}}},
                     [_client("gold"), _client("free")], n=24)
    order = _run(data).to_dataframe().sort_values("first_scheduled_s")["tenant_id"].tolist()
    window = order[1:13]
    assert window.count("gold") == 9 and window.count("free") == 3


def test_a_full_queue_drops_with_its_reason():
    """Room for one, a queue of 2: of 6 requests in a burst, one runs, two wait and three are
    dropped as gateway_queue_full; the summary counts them."""
    results = _run(_scenario({"max_outstanding_per_replica": 1, "max_queue": 2}, [_client("c")], n=6))
    frame = results.to_dataframe()
    assert (frame["status"] == "completed").sum() == 3
    assert (frame["dropped_reason"] == "gateway_queue_full").sum() == 3
    section = results.summary()["gateway"]
    assert (section["queued"], section["dropped"], section["max_waiting"], section["waiting_at_end"]) == (2, 3, 2, 0)


@pytest.mark.parametrize(("change", "message"), [
    ({"max_outstanding_per_replica": 0}, "serving.gateway.max_outstanding_per_replica: must be >= 1"),
    ({"queue_by": "region"}, "serving.gateway.queue_by"),
    ({"dispatch": {"kind": "lottery"}}, "serving.gateway.dispatch.kind: unknown gateway dispatch policy 'lottery'; one of: fair, fifo, priority"),
    ({"dispatch": {"kind": "fair", "params": {"weights": {"a": -1}}}}, "serving.gateway.dispatch.params.weights.a: must be a number > 0"),
])
def test_bad_gateway_settings_are_refused_by_key_path(change, message):
    """Each bad setting is refused, naming its key path and what is allowed."""
    data = _scenario({"max_outstanding_per_replica": 1, **change}, [_client("c")])
    with pytest.raises(ScenarioError, match=re.escape(message)):
        scenario_from_dict(data)


def test_stale_views_are_refused_with_a_gateway():
    """A gateway's saturation reads live counts: with view_refresh_s it is refused."""
    data = _scenario({"max_outstanding_per_replica": 1}, [_client("c")])
    data["serving"]["view_refresh_s"] = 1.0
    with pytest.raises(ScenarioError, match=re.escape("serving.gateway: is not modelled with serving.view_refresh_s yet")):
        scenario_from_dict(data)


class _View:
    def __init__(self, served: dict[str, int]) -> None:
        self.served = served

    @property
    def outstanding_requests(self) -> int:
        return self.served["sent"] - self.served["ended"]


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=40),
    services=st.lists(st.floats(0.01, 3.0), min_size=40, max_size=40),
    limit=st.integers(1, 4),
    cap=st.one_of(st.none(), st.integers(0, 5)),
)
def test_every_request_ends_exactly_once(gaps, services, limit, cap):
    """Whatever the arrivals, service times, limit and queue cap: every request either reaches
    the server once and ends, or is dropped at the gateway once; none is lost or duplicated, and
    the server never holds more than the limit."""
    env = simpy.Environment()
    arrivals, completions = Wire(env), Wire(env)
    counts = {"sent": 0, "ended": 0, "peak": 0}
    ended: list[int] = []
    recorder = Recorder()
    gateway = Gateway(env, arrivals, completions, lambda: [_View(counts)], GatewayConfig(max_outstanding_per_replica=limit, max_queue=cap),
                      Fifo(), recorder, consumer_waits=True)
    completions.connect(lambda req: ended.append(req.id))

    def serve(req: Request):
        yield env.timeout(services[req.id])
        counts["ended"] += 1
        completions.put(req)

    def route(req: Request) -> None:  # counted as it is routed, as the router counts
        counts["sent"] += 1
        counts["peak"] = max(counts["peak"], counts["sent"] - counts["ended"])
        env.process(serve(req))

    arrivals.connect(route)

    def source():
        for i, gap in enumerate(gaps):
            yield env.timeout(gap)
            req = Request(id=i, client_id="c", prompt_tokens=1, output_tokens=1, arrival_s=env.now)
            recorder.on_arrival(req, env.now)
            arrivals.put(req)

    env.process(source())
    env.run()
    assert sorted(ended) == list(range(len(gaps)))
    assert counts["sent"] == len(gaps) - gateway.stats["dropped"] and counts["peak"] <= limit
    assert gateway.waiting == 0


def test_a_fair_weight_for_no_tenant_is_refused():
    """A weight naming a tenant no client has is refused, naming the key and the sub-queues, rather
    than leaving that tenant's requests at weight 1 unnoticed."""
    data = _scenario({"max_outstanding_per_replica": 1, "dispatch": {"kind": "fair", "params": {"weights": {"gld": 3}}}},
                     [_client("gold"), _client("free")])
    with pytest.raises(ScenarioError, match=re.escape("serving.gateway.dispatch.params.weights.gld: no client's tenant is 'gld'; "
                                                      "the sub-queues are free, gold")):
        scenario_from_dict(data)
