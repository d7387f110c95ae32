"""How the workload generator makes its requests: by position when a source's shared fields
allow it (the same request as by keyword), and the rows of a client whose lifecycle ends."""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import pytest

from simpy_llm import Request, load_scenario
from simpy_llm.config.schema import ActiveWindow, ClientConfig, LifecycleConfig
from simpy_llm.rng import RandomStreams
from simpy_llm.workload.arrivals import PoissonArrivals
from simpy_llm.workload.distributions import Constant
from simpy_llm.workload.generator import ClientSource, make_request, positional_fields, warp_to_windows


def _client(**fields: Any) -> ClientConfig:
    return ClientConfig(
        id="a", rate_fraction=1.0, arrival=PoissonArrivals(),
        input_distribution=Constant(value=10), output_distribution=Constant(value=5), **fields,
    )


@pytest.mark.parametrize(
    "client",
    [
        _client(),
        _client(tenant_id="team", slo_class="batch", priority=3, streaming=0.0),
        _client(prefix_group="system", prefix_length=64),
        *load_scenario("scenarios/quickstart.yaml").workload.clients,
        *load_scenario("scenarios/two_clients.yaml").workload.clients,
    ],
    ids=lambda c: c.id,
)
def test_a_request_made_by_position_equals_the_one_made_by_keyword(client: ClientConfig) -> None:
    """For a synthetic client's shared fields, ``Request(id, client_id, prompt, output,
    arrival_s, *tail)`` gives every field the value :func:`make_request` gives it."""
    base = ClientSource(client, 1.0, RandomStreams(7), 7).base
    found = positional_fields(base)
    assert found is not None
    client_id, tail = found
    by_position = Request(11, client_id, 120, 30, 2.5, *tail)
    by_keyword = make_request(11, 2.5, base, 120, 30, None)
    assert attrs.astuple(by_position, recurse=False) == attrs.astuple(by_keyword, recurse=False)


@pytest.mark.parametrize(
    "base",
    [
        {},  # a trace's rows carry their own fields
        {"client_id": "c", "slo_class": "batch"},  # tenant_id, before slo_class, defaults to the client id
        {"client_id": "c", "tenant_id": "c", "colour": "red"},  # not a field of the request
        {"client_id": "c", "tenant_id": "c", "prompt_tokens": 3},  # make_request gives that itself
    ],
)
def test_shared_fields_that_cannot_go_by_position_are_refused(base: dict[str, Any]) -> None:
    """Shared fields without a client id, lacking a field before their last whose default is
    computed per request, or naming a field that is not the request's or that the row gives,
    are left to :func:`make_request` (None)."""
    assert positional_fields(base) is None


def test_a_client_id_alone_leaves_the_tenant_to_its_default() -> None:
    """Shared fields of the client id alone go by position with nothing after the arrival
    time, and the tenant is the client id, as by keyword."""
    assert positional_fields({"client_id": "c"}) == ("c", ())
    assert Request(1, "c", 10, 2, 0.5).tenant_id == "c"


def test_a_client_whose_lifecycle_ends_stops_at_the_first_arrival_past_its_last_window() -> None:
    """A client with windows gives, in order, the rows its arrivals without windows would, each
    time mapped into the windows, up to (not including) the first time past the last window,
    and no row after it."""
    windows = LifecycleConfig(windows=(ActiveWindow(start_s=1.0, end_s=3.0), ActiveWindow(start_s=10.0, end_s=12.0)))
    plain = list(zip(range(5000), ClientSource(_client(), 50.0, RandomStreams(3), 3).rows(), strict=False))
    times = warp_to_windows(np.array([row[0] for _, row in plain]), windows)
    ended = int(np.flatnonzero(np.isinf(times))[0])
    rows = list(ClientSource(_client(lifecycle=windows), 50.0, RandomStreams(3), 3).rows())
    assert len(rows) == ended
    assert [r[0] for r in rows] == times[:ended].tolist()
    assert [r[1:] for r in rows] == [row[1:] for _, row in plain[:ended]]


def test_a_trace_row_by_position_is_the_keyword_request() -> None:
    """A trace row with only its client, tenant and SLO class makes, by position, the request
    that keywords make."""
    import attrs

    from simpy_llm.entities import Request

    extra = {"client_id": "c", "tenant_id": "t", "slo_class": "batch"}
    made = make_request(3, 0.25, {}, 40, 9, extra)
    by_keyword = Request(id=3, prompt_tokens=40, output_tokens=9, arrival_s=0.25, **extra)
    assert attrs.astuple(made) == attrs.astuple(by_keyword)


def test_one_source_merges_as_the_heap_does() -> None:
    """With one source, merge_sources yields the rows, limit and horizon as with the heap (a
    second source that never yields takes the heap's way), and reads the source ahead by one
    row alike."""
    from simpy_llm.workload.generator import merge_sources

    rows = [(0.5 * i, 10 + i, 2 + i, None) for i in range(8)]

    def source(log: list[int]):
        for i, row in enumerate(rows):
            log.append(i)
            yield row

    for limit, horizon in ((None, None), (3, None), (None, 2.0), (0, None), (20, 10.0)):
        one_log: list[int] = []
        two_log: list[int] = []
        one = merge_sources([source(one_log)], limit, horizon)
        two = merge_sources([source(two_log), iter(())], limit, horizon)
        for a, b in zip(one, two, strict=True):
            assert a == b and one_log == two_log
        assert one_log == two_log
