"""The request sources of a workload, built once from its spec and its random streams.

:func:`build_sources` is the one place a :class:`~simpy_llm.config.schema.WorkloadConfig`
becomes sources: the :class:`~simpy_llm.simulation.Simulation`, the workload export
(:func:`~simpy_llm.workload.export.generate_requests`) and the observer's closed-loop
sessions (:class:`~simpy_llm.observe.sessions.Conversations`) all call it, so the same
spec and seed give the same requests everywhere. It builds

* one :class:`~simpy_llm.workload.generator.ClientSource` per synthetic client
  (sharing ``aggregate_rate`` by their ``rate_fraction``) and per ServeGen client
  (sharing the data's own scaled rate); a client with ``rate_fraction: 0`` is left
  out with a :class:`~simpy_llm.config.errors.ScenarioWarning`;
* one replay per trace (the file is read here; rows are produced lazily);

all drawing from one :class:`~simpy_llm.rng.RandomStreams` whose root seed is the
workload's ``seed``, else the seed the caller gives (a scenario's root seed), else 0.

Checking a trace header's ``server`` block against the engine needs the serving
config, so that check stays with the simulation
(:func:`~simpy_llm.workload.traces.server_block_mismatches` on :attr:`WorkloadSources.traces`).

Examples
--------
>>> from simpy_llm.loading import load_workload
>>> sources = build_sources(load_workload("scenarios/workloads/two_clients.yaml"))
>>> sources.seed, [src.client.id for src in sources.clients]
(42, ['high-volume-batch', 'realtime-chat'])
>>> round(sources.client("realtime-chat").rate, 6)
30.0
>>> len(sources.generator_sources())  # (base fields, rows) per source, for the WorkloadGenerator
2
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from simpy_llm.config.errors import ScenarioWarning
from simpy_llm.config.schema import Scenario, WorkloadConfig
from simpy_llm.rng import RandomStreams
from simpy_llm.workload.generator import ClientSource

if TYPE_CHECKING:
    from simpy_llm.config.schema import ClientConfig, Scenario, TraceSource, WorkloadConfig
    from simpy_llm.workload.traces import Trace

__all__ = ["WorkloadSources", "build_sources", "spec_workload", "workload_seed"]


def workload_seed(workload: WorkloadConfig, default: int = 0) -> int:
    """Root seed of the workload's random streams: its own ``seed``, else *default*
    (a scenario's root seed; 0 for a bare workload spec without a seed).

    >>> from simpy_llm.loading import load_workload
    >>> wl = load_workload("scenarios/workloads/two_clients.yaml")
    >>> workload_seed(wl), workload_seed(wl.__class__(clients=wl.clients, aggregate_rate=1.0, num_requests=1), 7)
    (42, 7)
    """
    return workload.seed if workload.seed is not None else default


def spec_workload(spec: Scenario | WorkloadConfig) -> tuple[WorkloadConfig, int]:
    """The workload of *spec* (a scenario, or a bare workload spec) and the root seed of its streams.

    >>> from simpy_llm import load_scenario
    >>> wl, seed = spec_workload(load_scenario("scenarios/quickstart.yaml"))
    >>> len(wl.clients), seed
    (2, 42)
    """

    if isinstance(spec, Scenario):
        return spec.workload, workload_seed(spec.workload, spec.seed)
    if isinstance(spec, WorkloadConfig):
        return spec, workload_seed(spec)
    raise TypeError(f"expected a Scenario or a WorkloadConfig, got {type(spec).__name__}")


class WorkloadSources:
    """A workload's sources, built by :func:`build_sources`.

    Attributes
    ----------
    workload
        The spec they were built from.
    streams
        The random streams every source draws from (``workload/<client>/...``; the
        emulated server also draws its output lengths from them).
    clients
        The synthetic and ServeGen clients that send requests (``rate_fraction > 0``),
        in source order: the workload's clients first, then the ServeGen ones.
    traces
        ``(source, trace)`` per replayed trace, the file read and prepared for replay
        (:func:`~simpy_llm.workload.traces.load_trace`), in the workload's order.
    """

    def __init__(
        self,
        workload: WorkloadConfig,
        streams: RandomStreams,
        clients: list[ClientSource],
        traces: list[tuple[TraceSource, Trace]],
    ) -> None:
        self.workload = workload
        self.streams = streams
        self.clients = clients
        self.traces = traces
        self._by_id = {src.client.id: src for src in clients}

    @property
    def seed(self) -> int:
        """Root seed of :attr:`streams`."""
        return self.streams.seed

    def client(self, client_id: str) -> ClientSource | None:
        """The source of the client named *client_id* (None if there is none, or it sends nothing)."""
        return self._by_id.get(client_id)

    @property
    def by_client_id(self) -> dict[str, ClientSource]:
        """Every client source by its client id."""
        return dict(self._by_id)

    def session_source_indices(self) -> set[int]:
        """Indices (in :meth:`generator_sources` order) of the clients that open sessions."""
        return {
            i for i, src in enumerate(self.clients) if src.workflow is not None
        }

    def generator_sources(self) -> list[tuple[dict[str, Any], Iterator[Any]]]:
        """``(base fields, rows)`` per source, as the
        :class:`~simpy_llm.workload.generator.WorkloadGenerator` takes them: the clients
        (in :attr:`clients` order, so a source index below ``len(clients)`` is a client),
        then the traces. The rows are new iterators over the sources' shared streams:
        take them once per run."""
        out: list[tuple[dict[str, Any], Iterator[Any]]] = [(src.base, src.rows()) for src in self.clients]
        if self.traces:  # the trace module loads pandas: only when there is a trace
            from simpy_llm.workload.traces import trace_rows

            # each trace its own prefix-block namespace: block ids are only comparable within a trace
            out += [({}, trace_rows(trace, src, namespace=i)) for i, (src, trace) in enumerate(self.traces)]
        return out

    def __repr__(self) -> str:
        return f"<WorkloadSources seed={self.seed} clients={len(self.clients)} traces={len(self.traces)}>"


def build_sources(
    workload: WorkloadConfig,
    *,
    default_seed: int = 0,
    key_prefix: str = "workload.",
    stacklevel: int = 1,
) -> WorkloadSources:
    """Build the request sources of *workload* with their random streams.

    Parameters
    ----------
    workload
        The workload spec.
    default_seed
        Root seed when the workload gives none (a scenario passes its own ``seed``).
    key_prefix
        Where the workload sits in its file, for the key paths in warnings
        (``"workload."`` in a scenario, ``""`` for a bare workload spec).
    stacklevel
        Where a :class:`~simpy_llm.config.errors.ScenarioWarning` points: 1 is the
        line calling this function, 2 its caller, as for :func:`warnings.warn`.

    Raises
    ------
    ScenarioError
        A ServeGen directory or a trace file that cannot be read.
    """
    streams = RandomStreams(workload_seed(workload, default_seed))
    clients = _client_sources(workload, streams, key_prefix, stacklevel + 2)
    traces = []
    if workload.traces:
        from simpy_llm.workload.traces import load_trace

        traces = [(src, load_trace(src)) for src in workload.traces]
    return WorkloadSources(workload, streams, clients, traces)


def _client_sources(workload: WorkloadConfig, streams: RandomStreams, key_prefix: str, stacklevel: int) -> list[ClientSource]:
    """One source per synthetic client: the workload's clients share ``aggregate_rate``,
    ServeGen clients share the data's own (scaled) rate."""
    seed = streams.seed
    groups: list[tuple[tuple[ClientConfig, ...], float]] = []
    if workload.clients:
        groups.append((workload.clients, workload.aggregate_rate or 0.0))
    if workload.servegen_data is not None:
        from simpy_llm.workload.servegen import load_servegen  # the ServeGen reader, for the workloads that use it

        servegen_clients, rate = load_servegen(workload.servegen_data)
        groups.append((tuple(servegen_clients), rate))
    sources = []
    for clients, aggregate in groups:
        total = sum(c.rate_fraction for c in clients)
        for i, c in enumerate(clients):
            if c.rate_fraction > 0:
                sources.append(ClientSource(c, aggregate * c.rate_fraction / total, streams, seed))
            else:
                where = f"{key_prefix}clients[{i}].rate_fraction" if clients is workload.clients else f"{key_prefix}servegen_data"
                warnings.warn(
                    f"client {c.id!r} has rate_fraction 0 ({where}): it is left out of the workload and sends no requests",
                    ScenarioWarning,
                    stacklevel=stacklevel,  # the caller's own stacklevel + 2: this function and build_sources
                )
    return sources
