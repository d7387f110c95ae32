"""The serving section of a scenario: replica groups and their engines or batch servers,
devices, clusters, disaggregated prefill/decode pools and the KV hand-off between them.

Part of the config tree (:mod:`simpy_llm.config.schema` gathers it); values and shapes only.
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs

from simpy_llm.config.common import (
    AdmissionSpec,
    BatchServiceSpec,
    BinSelectorSpec,
    LatencySpec,
    LinkFaults,
    PolicySpec,
    RouterSpec,
)
from simpy_llm.config.engine import EngineConfig
from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.gateway import GatewayConfig
from simpy_llm.config.paths import resolve_path
from simpy_llm.config.predictor import OutputPredictor
from simpy_llm.config.validators import (
    MAX_KV_BLOCKS,
    MAX_REPLICAS,
    MAX_REQUESTS,
    MAX_TIME_S,
    MAX_TOKENS,
    MIN_PERIOD_S,
    all_of,
    at_least,
    at_most,
    greater_than,
    in_range,
    non_empty,
    one_of,
    optional,
)

__all__ = [
    "LOCAL_NVME_BYTES_PER_S",
    "MAX_BINS",
    "ROLES",
    "SLA_CONTROLLER_KINDS",
    "VIEW_REFRESH_FIELDS",
    "WEIGHT_SOURCES",
    "BatchServerConfig",
    "BinsConfig",
    "ClusterConfig",
    "DisaggregationConfig",
    "DynamicBatchingConfig",
    "KvTransferConfig",
    "MemoryLimitConfig",
    "ReplicaGroupConfig",
    "ServingConfig",
    "check_replica_kind",
]


MAX_BINS = 1024
"""Most bins a batch server may have."""

VIEW_REFRESH_FIELDS = ("state", "all")
"""The values of ``serving.view_refresh_fields``: what a refreshed view holds as of its refresh."""


def _increasing(inst: Any, attribute: attrs.Attribute, value: tuple[float, ...] | None) -> None:
    if value is not None and any(b <= a for a, b in itertools.pairwise(value)):
        raise FieldValueError(attribute.name, f"must be strictly increasing; got {list(value)}")


@attrs.frozen(kw_only=True)
class BinsConfig:
    """The multi-bin layer of a batch server: k bins by predicted request size (seed 001 §1.3, §7).

    A request's *size* is what its service time grows with: its sampled service time
    (service ``sampled``) or its prompt plus output tokens (the token-based service
    models). The bins split the predicted size at ``count - 1`` boundaries: given
    explicitly, or the empirical ``i/count`` quantiles of the first
    ``warmup_requests`` predicted sizes (equal-mass bins), computed when the last of
    them arrives; until then the server batches from one queue (bin 0), and the requests
    still waiting then are re-binned in their order.
    """

    count: int = attrs.field(default=1, validator=all_of(at_least(1), at_most(MAX_BINS)))
    """Number of bins k (1: a single FIFO queue)."""
    boundaries: tuple[float, ...] | None = attrs.field(default=None, validator=optional(_increasing))
    """The ``count - 1`` inner boundaries, strictly increasing (bin i holds sizes in
    ``[boundaries[i-1], boundaries[i])``); None: equal-mass from a warm-up sample."""
    warmup_requests: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(MAX_REQUESTS))))
    """Predicted sizes sampled for equal-mass boundaries (only without ``boundaries``;
    default 1000 with more than one bin, none with one). Given with one bin it changes
    nothing (one bin needs no boundaries); it is accepted so that sweeps over ``count``
    can keep it."""
    predictor: OutputPredictor = attrs.field(factory=lambda: OutputPredictor(kind="oracle"))
    """How well the server knows a request's size: ``{kind: oracle}`` or ``{kind: noisy,
    sigma, seed}`` (the true size times a mean-preserving log-normal error)."""

    def __attrs_post_init__(self) -> None:
        if self.boundaries is not None:
            if len(self.boundaries) != self.count - 1:
                raise FieldValueError("boundaries", f"needs count - 1 = {self.count - 1} inner boundaries; got {len(self.boundaries)}")
            if self.warmup_requests is not None:
                raise FieldValueError("warmup_requests", "applies only without explicit boundaries")
        elif self.warmup_requests is not None and self.warmup_requests < self.count:
            raise FieldValueError("warmup_requests", f"must be at least count ({self.count}) to give {self.count} quantiles")

    @property
    def warmup_size(self) -> int:
        """Requests sampled before the boundaries are set (0 with explicit boundaries or one bin)."""
        if self.boundaries is not None:
            return 0
        if self.warmup_requests is not None:
            return self.warmup_requests
        return 1000 if self.count > 1 else 0


@attrs.frozen(kw_only=True)
class MemoryLimitConfig:
    """The KV memory a batch may use, ``eta`` tokens (seed 001 §2.2): given as
    ``capacity_tokens``, or as ``(gpu_memory_gb - model_memory_gb) / kv_bytes_per_token``."""

    capacity_tokens: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(MAX_KV_BLOCKS * 1024))))
    """KV capacity, tokens."""
    gpu_memory_gb: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(1e6))))
    """Device memory M_max, GB (1e9 bytes)."""
    model_memory_gb: float | None = attrs.field(default=None, validator=optional(all_of(at_least(0), at_most(1e6))))
    """Memory the weights and activations take, M_model, GB."""
    kv_bytes_per_token: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(2.0**40))))
    """KV cache bytes per token."""
    safety_fraction: float = attrs.field(default=0.1, validator=in_range(0.0, 0.99))
    """Safety buffer L0 as a share of eta, kept free by the batch-size choice."""
    window_batches: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(MAX_REQUESTS))))
    """``b_mem``'s mean prompt and output lengths are over the requests of the last this
    many finished batches (seed 001 §2.2's "recent batches"); None: over every finished batch."""

    def __attrs_post_init__(self) -> None:
        derived = (self.gpu_memory_gb, self.model_memory_gb, self.kv_bytes_per_token)
        if self.capacity_tokens is not None:
            for name, value in zip(("gpu_memory_gb", "model_memory_gb", "kv_bytes_per_token"), derived, strict=True):
                if value is not None:
                    raise FieldValueError(name, "give capacity_tokens or the three memory figures, not both")
        elif any(v is None for v in derived):
            raise FieldValueError("capacity_tokens", "required (or give gpu_memory_gb, model_memory_gb and kv_bytes_per_token)")
        elif self.eta_tokens < 1:
            raise FieldValueError("model_memory_gb", "leaves no memory for the KV cache (must be below gpu_memory_gb by at least one token's KV)")

    @property
    def eta_tokens(self) -> int:
        """The capacity eta, whole tokens."""
        if self.capacity_tokens is not None:
            return self.capacity_tokens
        # Without capacity_tokens the three figures are all given (checked when made).
        assert self.gpu_memory_gb is not None and self.model_memory_gb is not None and self.kv_bytes_per_token is not None
        return int((self.gpu_memory_gb - self.model_memory_gb) * 1e9 // self.kv_bytes_per_token)


SLA_CONTROLLER_KINDS = ("corrected", "seed")
"""The SLA controllers of dynamic batching (``simpy_llm.policies.batching.SLA_CONTROLLERS``)."""


@attrs.frozen(kw_only=True)
class DynamicBatchingConfig:
    """Dynamic batch sizes ``b_target = min(b_mem, b_SLA)`` (seed 001 §2), formed when the server is free."""

    d_sla_s: float = attrs.field(validator=all_of(greater_than(0), at_most(MAX_TIME_S)))
    """Target batch latency D_SLA, s (a request whose batch takes longer violates the SLA)."""
    eps_d_s: float | None = attrs.field(default=None, validator=optional(all_of(at_least(0), at_most(MAX_TIME_S))))
    """Tolerance, s (default 10% of D_SLA): for ``seed``, the band around D_SLA in which the
    interval is re-centred; for ``corrected``, how much faster the largest size known to
    meet D_SLA must become before larger sizes are tried again."""
    sla_controller: str = attrs.field(default="corrected", validator=one_of(SLA_CONTROLLER_KINDS))
    """``corrected`` (default): finds the largest batch size whose latency meets D_SLA and
    re-opens its interval when the SLA is missed at its lower end; ``seed``: seed 001 §2.3
    step for step, which can lock on a size above the target (``docs/batching.md``)."""
    b_min: int = attrs.field(default=1, validator=all_of(at_least(1), at_most(MAX_TOKENS)))
    """Smallest batch size the controller chooses."""
    b_max: int = attrs.field(default=128, validator=all_of(at_least(1), at_most(MAX_TOKENS)))
    """Largest batch size."""
    max_candidates: int = attrs.field(default=256, validator=all_of(at_least(1), at_most(MAX_TOKENS)))
    """Requests pulled from the selected bin as candidates; a batch is at most this many."""
    ema_alpha: float | None = attrs.field(default=None, validator=optional(in_range(0.001, 1.0)))
    """Weight of the newest batch in the controller's moving averages (default 0.2; not
    with ``window_batches``)."""
    window_batches: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(MAX_REQUESTS))))
    """The controller's averages are plain means over the last this many batches (per
    batch size for ``corrected``) instead of moving averages (seed 001 §2.2's "recent
    batches"); None: moving averages with ``ema_alpha``."""
    memory: MemoryLimitConfig | None = None
    """KV memory limit (None: none, ``b_mem = b_max``)."""
    bin_selection: BinSelectorSpec = attrs.field(factory=lambda: PolicySpec(kind="round_robin"))
    """Bin to batch from when several hold requests: ``round_robin`` or ``longest_queue``."""

    def __attrs_post_init__(self) -> None:
        if self.b_min > self.b_max:
            raise FieldValueError("b_min", f"must not exceed b_max ({self.b_max}); got {self.b_min}")
        if self.ema_alpha is not None and self.window_batches is not None:
            raise FieldValueError("ema_alpha", "give ema_alpha (moving averages) or window_batches (means of the last batches), not both")

    @property
    def tolerance_s(self) -> float:
        """``eps_d_s``, or its default of 10% of ``d_sla_s``."""
        return self.eps_d_s if self.eps_d_s is not None else 0.1 * self.d_sla_s

    @property
    def alpha(self) -> float:
        """``ema_alpha``, or its default of 0.2."""
        return self.ema_alpha if self.ema_alpha is not None else 0.2


@attrs.frozen(kw_only=True)
class BatchServerConfig:
    """A request-level batch server (``docs/batching.md``): the unit of service is a whole
    batch, which holds the server until its slowest request ends.

    Exactly one of ``batch_size`` (fixed B: a bin that holds B requests forms a batch,
    pushed to a central FIFO batch queue) and ``dynamic`` (a batch formed when the server
    is free, of the size the dynamic batcher sets).
    """

    service: BatchServiceSpec
    """Batch service-time model: ``sampled`` (a per-request service time from a
    distribution; the batch takes the longest), ``linear`` (seed 001 §5.1) or
    ``latency_model`` (the replica's latency model run as a static batch)."""
    bins: BinsConfig = attrs.field(factory=BinsConfig)
    """The multi-bin layer."""
    batch_size: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(MAX_TOKENS))))
    """Fixed batch size B."""
    dynamic: DynamicBatchingConfig | None = None
    """Dynamic batching instead of a fixed B."""
    max_wait_s: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(MAX_TIME_S))))
    """With a fixed B: when the server is free and no full batch is formed, a bin whose
    oldest request has waited this long gives it a smaller batch of all it holds (None,
    the theory's setting: only full batches)."""
    d_sla_s: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(MAX_TIME_S))))
    """With a fixed B: the batch latency D_SLA its batches are judged against, s (the
    summary's ``sla.violation_rate``; it changes nothing that is simulated). None: no
    target, no violation rate. A dynamic batcher's target is ``dynamic.d_sla_s``."""

    def __attrs_post_init__(self) -> None:
        if (self.batch_size is None) == (self.dynamic is None):
            raise FieldValueError("batch_size", "give exactly one of batch_size (a fixed B) and dynamic")
        if self.max_wait_s is not None and self.dynamic is not None:
            raise FieldValueError("max_wait_s", "applies only with a fixed batch_size (dynamic batches form when the server is free)")
        if self.d_sla_s is not None and self.dynamic is not None:
            raise FieldValueError("d_sla_s", "applies only with a fixed batch_size (a dynamic batcher's target is dynamic.d_sla_s)")

    @property
    def sla_target_s(self) -> float | None:
        """The batch latency target its batches are judged against, s: ``dynamic.d_sla_s``
        or, with a fixed B, ``d_sla_s`` (None: none given)."""
        return self.dynamic.d_sla_s if self.dynamic is not None else self.d_sla_s


def _device_path(value: Any) -> Any:
    """A device: a shipped profile id as given, a file path resolved against the scenario's directory."""
    if isinstance(value, str) and (value.endswith((".yaml", ".yml")) or "/" in value):
        return resolve_path(value)
    return value


WEIGHT_SOURCES = ("host_memory", "local_nvme")
"""Where a cold start reads a model's weights from (``ReplicaGroupConfig.weights_from``)."""

LOCAL_NVME_BYTES_PER_S = 7.0e9
"""Sequential read of a local PCIe 4.0 x4 NVMe drive, bytes/s (datacenter drives read 6.8 to
7.4 GB/s: e.g. Samsung PM1743 / 990 PRO datasheets)."""

ROLES = ("both", "prefill", "decode")
"""What a replica group does: prefill and decode, or one of them (disaggregated)."""


@attrs.frozen(kw_only=True)
class ReplicaGroupConfig:
    """Identical replicas sharing engine settings and a latency model (model, GPU, TP)."""

    name: str = attrs.field(validator=non_empty)
    """Group name, unique within the fleet (shown to routers and in records)."""
    count: int = attrs.field(default=1, validator=all_of(at_least(1), at_most(MAX_REPLICAS)))
    """Replicas in the group."""
    latency_model: LatencySpec | None = None
    """Step-time model of the group's replicas (required, except for a batch server whose
    service model does not use one)."""
    engine: EngineConfig = attrs.field(factory=EngineConfig)
    """Engine settings of the group's replicas (continuous batching only)."""
    batch_server: BatchServerConfig | None = None
    """Make the group's replicas request-level batch servers instead of continuous-batching
    engines (``docs/batching.md``)."""
    capacity: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(1e12))))
    """Relative service rate routers see (default: decode tokens per second of a full
    batch, ``max_num_seqs / step_time_s(0, max_num_seqs)``; for a batch server the same with
    its batch size or ``b_max``, or 1 when it has no latency model)."""
    role: str = attrs.field(default="both", validator=one_of(ROLES))
    """``both``: the replicas prefill and decode (co-located); ``prefill`` / ``decode``: a pool
    of a disaggregated fleet (needs ``serving.disaggregation``; ``docs/network.md``)."""
    device: str | None = attrs.field(default=None, converter=_device_path)
    """The device profile the replicas run on (a shipped id such as ``h100-sxm``, or a YAML
    file): its energy, price, cold start, thermal throttling and KV memory limit apply
    (``docs/devices.md``). None: none of those is modelled."""
    weights_from: str | None = attrs.field(default=None, validator=optional(one_of(WEIGHT_SOURCES)))
    """Where a cold start loads the model's weights from (seed 003's cold-start locality):
    ``host_memory`` (pinned host memory over the GPU's PCIe link) or ``local_nvme`` (a local
    NVMe drive, 7 GB/s); each GPU loads its share of the weights, ``weight bytes per GPU /
    bandwidth``, after its device's ``cold_start.load_s`` (if any). Needs a latency model
    that names its model, GPU and TP. None: no weight transfer is modelled."""
    warm_retention_s: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(MAX_TIME_S))))
    """An idle replica unloads its model after this long, and pays its cold start again at
    its next request (None: a loaded model stays loaded)."""

    def __attrs_post_init__(self) -> None:
        check_replica_kind(self.batch_server, self.engine, self.latency_model)
        if self.device is None and self.warm_retention_s is not None and self.weights_from is None:
            raise FieldValueError("warm_retention_s", "needs a cold start: weights_from, or a device whose profile has a cold_start")



def check_replica_kind(batch_server: BatchServerConfig | None, engine: EngineConfig, latency_model: PolicySpec | None) -> None:
    """A batch server has no engine settings; a continuous-batching engine needs a latency
    model. (Whether a batch server's service model uses one is the loader's check:
    :mod:`simpy_llm.loading.checks`.)

    Raises
    ------
    FieldValueError
        Naming the key given where it does not apply, or missing where it is needed.
    """
    if batch_server is None:
        if latency_model is None:
            raise FieldValueError("latency_model", "required key is missing")
        return
    if engine != EngineConfig():
        raise FieldValueError("engine", "engine settings apply to continuous batching; a batch_server has none (its batching is in batch_server)")


@attrs.frozen(kw_only=True)
class KvTransferConfig(LinkFaults):
    """How a request's KV travels from its prefill replica to its decode replica: over one
    :class:`~simpy_llm.network.link.Link` per (prefill, decode) pair, whose figures are
    these (or the topology's path between the two, when ``topology`` is given)."""

    bandwidth_gbps: float | None = attrs.field(default=100.0, validator=optional(all_of(greater_than(0), at_most(1e6))))
    """Link bandwidth, gigabits per second (None: unlimited); transfers in flight on one
    link share it equally."""
    rtt_ms: float = attrs.field(default=0.01, validator=all_of(at_least(0), at_most(MAX_TIME_S * 1e3)))
    """Round trip between the replicas, milliseconds (a transfer takes half of it)."""
    overhead_us: float = attrs.field(default=0.0, validator=all_of(at_least(0), at_most(MAX_TIME_S * 1e6)))
    """Fixed cost per transfer before its bytes move (setup, registration), microseconds."""
    bytes_per_token: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(1e9))))
    """KV bytes per token (None: from the prefill pool's model as its latency model names it,
    2 x layers x KV heads x head dim x 2 bytes, split over its TP degree's GPUs and summed)."""


@attrs.frozen(kw_only=True)
class DisaggregationConfig:
    """Prefill and decode on separate replica pools (DistServe, Splitwise; ``docs/network.md``).

    Arrivals are routed among the prefill pool by ``serving.router``; a prefill replica
    computes the prompt and the first token, the request's KV crosses a link to the
    decode replica ``decode_router`` chooses (a session's later rounds keep their first
    decode replica), which produces the rest. Without ``replica_groups``, the fleet's
    ``replicas`` are split: ``prefill_replicas`` prefill, the rest decode, all with the
    same engine and latency model, so removing this block gives the co-located fleet
    of the same size. With ``replica_groups``, each group's ``role`` says its pool.
    """

    prefill_replicas: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(MAX_REPLICAS))))
    """Replicas of the prefill pool when ``serving.replicas`` is split (without replica_groups)."""
    decode_router: RouterSpec = attrs.field(factory=lambda: PolicySpec(kind="round_robin"))
    """Routing policy choosing a handed-off request's decode replica."""
    kv_transfer: KvTransferConfig = attrs.field(factory=KvTransferConfig)
    """The links KV crosses."""
    topology: dict[str, Any] | None = None
    """A network topology between the replicas (``{type: links | complete | clos, ...}``,
    :meth:`~simpy_llm.network.topology.Topology.from_spec`), whose endpoints are the
    replicas named ``<group>/<k>`` (k from 0 within its group): each link's one-way
    latency and bandwidth are the path's (shortest by latency; its bottleneck), replacing
    ``kv_transfer.rtt_ms`` and ``bandwidth_gbps``."""


@attrs.frozen(kw_only=True)
class ClusterConfig:
    """One cluster of a multi-cluster fleet: its replica groups behind its own router
    (seed 003, "Multi-Cluster Routing")."""

    name: str = attrs.field(validator=non_empty)
    """Cluster name, unique in the fleet (records and the summary use it)."""
    router: RouterSpec = attrs.field(factory=lambda: PolicySpec(kind="round_robin"))
    """Routing policy among the cluster's replicas."""
    replica_groups: tuple[ReplicaGroupConfig, ...] = attrs.field(converter=tuple)
    """The cluster's replicas, as groups (names unique across the whole fleet)."""

    def __attrs_post_init__(self) -> None:
        if not self.replica_groups:
            raise FieldValueError("replica_groups", "a cluster needs at least one replica group")
        for i, group in enumerate(self.replica_groups):
            if group.role != "both":
                raise FieldValueError(f"replica_groups[{i}].role", "clusters hold co-located replicas (role: both)")


@attrs.frozen(kw_only=True)
class ServingConfig:
    """Replicas behind a router: either one group (``replicas``, ``engine``,
    ``latency_model``) or a heterogeneous fleet (``replica_groups``)."""

    latency_model: LatencySpec | None = None
    """Step-time model (``{kind: blis_linear, params: {...}}``); required without
    replica_groups (unless a batch_server's service model needs none)."""
    replicas: int = attrs.field(default=1, validator=all_of(at_least(1), at_most(MAX_REPLICAS)))
    """Number of identical replicas (without replica_groups)."""
    router: RouterSpec = attrs.field(factory=lambda: PolicySpec(kind="round_robin"))
    """Routing policy."""
    engine: EngineConfig = attrs.field(factory=EngineConfig)
    """Engine settings shared by all replicas (without replica_groups)."""
    batch_server: BatchServerConfig | None = None
    """Request-level batch servers instead of continuous-batching engines (without
    replica_groups; ``docs/batching.md``)."""
    replica_groups: tuple[ReplicaGroupConfig, ...] = ()
    """A heterogeneous fleet: groups of replicas, each with its own engine and latency model."""
    admission: AdmissionSpec = attrs.field(factory=lambda: PolicySpec(kind="always"))
    """Admission policy at the router (rejections are recorded drops with a reason)."""
    view_refresh_s: float | None = attrs.field(
        default=None, validator=optional(all_of(greater_than(0), in_range(MIN_PERIOD_S, MAX_TIME_S)))
    )
    """Routers and admission see replica state refreshed every this many seconds (the
    router's own counts of outstanding requests stay fresh). Default: always fresh."""
    view_refresh_fields: str = attrs.field(default="state", validator=one_of(VIEW_REFRESH_FIELDS))
    """What the refreshed views hold as of the last refresh, with ``view_refresh_s``:
    ``state`` (default): the replica-reported state (queues, queued prompt tokens, KV use);
    the departures that the outstanding counts subtract are read live, as responses pass
    the router. ``all``: the departures too, so that what a router knows between two
    refreshes is fixed at the earlier one (its own routed counts stay its own): the
    condition of an exact sharded run (``docs/scale.md``)."""
    disaggregation: DisaggregationConfig | None = None
    """Prefill and decode on separate pools (None: every replica does both)."""
    clusters: tuple[ClusterConfig, ...] = ()
    """A multi-cluster fleet: each cluster's groups behind its own router, and
    ``cluster_router`` routing arrivals among the clusters (``docs/network.md``)."""
    cluster_router: RouterSpec | None = None
    """Routing policy among the clusters (with ``clusters``; default round robin), which sees
    each cluster as the sum of its replicas (seed 003, "Multi-Cluster Routing")."""
    gateway: GatewayConfig | None = None
    """Flow control in front of the router: requests wait in ordered sub-queues while every
    replica is saturated (:mod:`simpy_llm.config.gateway`, ``docs/gateway.md``). None: none."""

    def __attrs_post_init__(self) -> None:
        if self.gateway is not None:
            for key, given in (("clusters", bool(self.clusters)), ("view_refresh_s", self.view_refresh_s is not None)):
                if given:
                    raise FieldValueError("gateway", f"is not modelled with serving.{key} yet (its saturation needs the live counts of one router)")
        if self.view_refresh_fields != "state" and self.view_refresh_s is None:
            raise FieldValueError("view_refresh_fields", "says what a refreshed view holds: give serving.view_refresh_s too")
        if self.clusters:
            self._check_clusters()
        elif self.cluster_router is not None:
            raise FieldValueError("cluster_router", "routes among clusters: give serving.clusters, or remove it")
        self._check_disaggregation()
        if self.replica_groups:
            if self.latency_model is not None:
                raise FieldValueError("latency_model", "give it per group under replica_groups, not both")
            if self.batch_server is not None:
                raise FieldValueError("batch_server", "give it per group under replica_groups, not both")
            names = [g.name for g in self.replica_groups]
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise FieldValueError("replica_groups", f"group names must be unique; repeated: {', '.join(dup)}")
        elif not self.clusters:
            check_replica_kind(self.batch_server, self.engine, self.latency_model)

    def _check_clusters(self) -> None:
        """With clusters, the fleet is theirs: no fleet-level groups, replica settings or router."""
        if self.router != PolicySpec(kind="round_robin"):
            raise FieldValueError("router", "with clusters, cluster_router routes among the clusters and each cluster has its own router")
        for key, given in (
            ("replica_groups", bool(self.replica_groups)), ("latency_model", self.latency_model is not None),
            ("batch_server", self.batch_server is not None), ("replicas", self.replicas != 1),
            ("engine", self.engine != EngineConfig()), ("disaggregation", self.disaggregation is not None),
        ):
            if given:
                raise FieldValueError(key, "with clusters, every replica belongs to a cluster: give it in clusters[].replica_groups"
                                      if key != "disaggregation" else "clusters hold co-located replicas; disaggregation is for a single fleet")
        names = [c.name for c in self.clusters]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise FieldValueError("clusters", f"cluster names must be unique; repeated: {', '.join(dup)}")
        groups = [g.name for c in self.clusters for g in c.replica_groups]
        dup = sorted({n for n in groups if groups.count(n) > 1})
        if dup:
            raise FieldValueError("clusters", f"replica group names must be unique across clusters; repeated: {', '.join(dup)}")

    def replica_names(self) -> list[str]:
        """Each replica's name in fleet order, ``<group>/<k>`` (k from 0 within its group): the
        endpoints a disaggregated fleet's topology connects."""
        return [f"{g.name}/{k}" for g in self.groups() for k in range(g.count)]

    @property
    def entry_router(self) -> PolicySpec:
        """The routing policy arrivals meet: ``cluster_router`` (round robin by default) with
        clusters, else ``router`` (over the prefill pool when disaggregated)."""
        if self.clusters:
            return self.cluster_router or PolicySpec(kind="round_robin")
        return self.router

    def group_paths(self) -> tuple[str, ...]:
        """The key path (inside ``serving``) of each group of :meth:`groups`, ending in a dot:
        ``""`` for the implied group(s), ``replica_groups[i].`` or ``clusters[c].replica_groups[i].``."""
        if self.clusters:
            return tuple(f"clusters[{c}].replica_groups[{i}]." for c, cl in enumerate(self.clusters) for i in range(len(cl.replica_groups)))
        if self.replica_groups:
            return tuple(f"replica_groups[{i}]." for i in range(len(self.replica_groups)))
        return ("",) * len(self.groups())

    def cluster_of(self) -> dict[str, str]:
        """Each replica group's cluster, by group name (empty without clusters)."""
        return {g.name: c.name for c in self.clusters for g in c.replica_groups}

    def _check_disaggregation(self) -> None:
        dis = self.disaggregation
        roles = [g.role for g in self.replica_groups]
        if dis is None:
            for i, role in enumerate(roles):
                if role != "both":
                    raise FieldValueError(f"replica_groups[{i}].role", f"{role!r} needs serving.disaggregation (or role: both)")
            return
        self._check_pools(dis, roles)
        if dis.topology is not None:
            default = KvTransferConfig()
            for key in ("rtt_ms", "bandwidth_gbps"):
                if getattr(dis.kv_transfer, key) != getattr(default, key):
                    raise FieldValueError(
                        f"disaggregation.kv_transfer.{key}",
                        "the topology's paths give each link its latency and bandwidth: set them there",
                    )

    def _check_pools(self, dis: DisaggregationConfig, roles: list[str]) -> None:
        if self.replica_groups:
            if dis.prefill_replicas is not None:
                raise FieldValueError(
                    "disaggregation.prefill_replicas",
                    "splits serving.replicas; with replica_groups give each group a role instead",
                )
            for i, role in enumerate(roles):
                if role == "both":
                    raise FieldValueError(f"replica_groups[{i}].role", "with disaggregation every group is a prefill or a decode pool")
            for needed in ("prefill", "decode"):
                if needed not in roles:
                    raise FieldValueError("replica_groups", f"a disaggregated fleet needs a group with role: {needed}")
            return
        if self.batch_server is not None:
            raise FieldValueError("disaggregation", "a batch_server serves whole requests; disaggregation needs continuous-batching replicas")
        if dis.prefill_replicas is None:
            raise FieldValueError("disaggregation.prefill_replicas", "required without replica_groups (how many of serving.replicas prefill)")
        if dis.prefill_replicas >= self.replicas:
            raise FieldValueError(
                "disaggregation.prefill_replicas",
                f"must leave at least one of serving.replicas ({self.replicas}) to decode; got {dis.prefill_replicas}",
            )

    def groups(self) -> tuple[ReplicaGroupConfig, ...]:
        """The fleet as groups (without replica_groups: a single group named ``default``, or
        the ``prefill`` and ``decode`` pools ``disaggregation.prefill_replicas`` splits it into)."""
        if self.clusters:
            return tuple(g for c in self.clusters for g in c.replica_groups)
        if self.replica_groups:
            return self.replica_groups
        if self.disaggregation is not None:
            p = self.disaggregation.prefill_replicas
            assert p is not None  # required without replica_groups (checked when made)
            return (
                ReplicaGroupConfig(name="prefill", count=p, role="prefill", latency_model=self.latency_model, engine=self.engine),
                ReplicaGroupConfig(name="decode", count=self.replicas - p, role="decode", latency_model=self.latency_model, engine=self.engine),
            )
        return (
            ReplicaGroupConfig(
                name="default", count=self.replicas, latency_model=self.latency_model,
                engine=self.engine, batch_server=self.batch_server,
            ),
        )

    @property
    def num_replicas(self) -> int:
        """Replicas in the whole fleet."""
        return sum(g.count for g in self.groups())
