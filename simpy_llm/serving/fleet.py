"""The fleet: replica groups resolved into what each replica runs with.

A scenario's ``serving`` section is one group of identical replicas or a
list of ``replica_groups`` (a heterogeneous fleet). :func:`plan_fleet` turns
either into one :class:`ReplicaPlan` per replica: its group, its latency
model object, its engine settings with the hardware-derived values filled in
(``kv_num_blocks: auto``, the swap copy rate) and its capacity as routers see it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.serving import LOCAL_NVME_BYTES_PER_S
from simpy_llm.config.structure import build_policy
from simpy_llm.serving.hardware import auto_kv_blocks
from simpy_llm.serving.latency import latency_models
from simpy_llm.serving.latency_base import missing_members

if TYPE_CHECKING:
    from simpy_llm.config.schema import BatchServerConfig, EngineConfig, ReplicaGroupConfig, ServingConfig

__all__ = ["ReplicaPlan", "mean_step_time_s", "plan_fleet", "resolve_engine"]


@attrs.frozen(kw_only=True)
class ReplicaPlan:
    """What one replica runs with."""

    group: str
    """Name of its replica group."""
    engine: EngineConfig
    """Engine settings, with ``kv_num_blocks`` and the swap settings resolved."""
    latency: Any
    """Its latency model object (shared by the replicas of a group; None for a batch server
    whose service model needs none)."""
    capacity: float
    """Relative service rate shown to routers."""
    batch_server: BatchServerConfig | None = None
    """The group's request-level batch server settings (None: a continuous-batching engine)."""
    role: str = "both"
    """``both``, or its pool in a disaggregated fleet (``prefill`` / ``decode``)."""
    cluster: str = ""
    """Its cluster in a multi-cluster fleet ("" otherwise)."""
    device: Any = None
    """The :class:`~simpy_llm.serving.devices.DeviceProfile` it runs on (None: not modelled)."""
    gpus: int = 1
    """Devices (GPUs) it occupies: its latency model's tensor-parallel degree times its
    pipeline stages (``Hardware.gpus``; 1 if unknown)."""
    load_s: float = 0.0
    """Cold start: time to load its model before serving (0: loaded from the start)."""
    warm_retention_s: float | None = None
    """Idle time after which it unloads its model (None: never)."""


def resolve_engine(engine: EngineConfig, latency: Any) -> EngineConfig:
    """*engine* with ``kv_num_blocks: auto`` and unset swap settings derived from the
    latency model's hardware (``latency.hardware``: model, GPU, TP degree).

    Raises
    ------
    FieldValueError
        Naming the engine key that needs hardware the latency model does not describe.
    """
    changes: dict[str, Any] = {}
    hardware = latency.hardware

    def need_hardware(key: str, what: str) -> Any:
        if hardware is None:
            raise FieldValueError(
                key,
                f"{what} needs a latency model that names its model, gpu and tp (e.g. blis_linear or roofline with a profile), or an explicit value",
            )
        return hardware

    if engine.kv_num_blocks == "auto":
        hw = need_hardware("kv_num_blocks", "auto")
        utilization = engine.gpu_memory_utilization if engine.gpu_memory_utilization is not None else 0.9
        try:
            blocks = auto_kv_blocks(hw, engine.kv_block_size, gpu_memory_utilization=utilization)
        except FieldValueError as exc:
            raise FieldValueError("kv_num_blocks", f"auto: {exc.message}") from None
        if blocks * engine.kv_block_size < engine.max_num_batched_tokens:
            raise FieldValueError(
                "kv_num_blocks",
                f"auto gives {blocks} blocks of {engine.kv_block_size} tokens, fewer than "
                f"max_num_batched_tokens ({engine.max_num_batched_tokens}) tokens",
            )
        changes["kv_num_blocks"] = blocks
    if engine.preemption_mode == "swap":
        if engine.swap_kv_bytes_per_token is None:
            changes["swap_kv_bytes_per_token"] = float(need_hardware("swap_kv_bytes_per_token", "swap").kv_bytes_per_token)
        if engine.swap_bandwidth_gb_per_s is None:
            hw = need_hardware("swap_bandwidth_gb_per_s", "swap")
            changes["swap_bandwidth_gb_per_s"] = hw.gpu.pcie_bandwidth_bytes_per_s / 1e9
    if engine.kv_offload_blocks:
        if engine.kv_offload_bytes_per_token is None:
            changes["kv_offload_bytes_per_token"] = float(need_hardware("kv_offload_bytes_per_token", "kv_offload_blocks").kv_bytes_per_token)
        if engine.kv_offload_bandwidth_gb_per_s is None:
            hw = need_hardware("kv_offload_bandwidth_gb_per_s", "kv_offload_blocks")
            changes["kv_offload_bandwidth_gb_per_s"] = hw.gpu.pcie_bandwidth_bytes_per_s / 1e9
    return attrs.evolve(engine, **changes) if changes else engine


def mean_step_time_s(latency: Any) -> Any:
    """*latency*'s step time without drawing: its ``mean_step_time_s`` when it samples step
    times (a LUT with ``tail: sampled``), else its ``step_time_s``."""
    return latency.mean_step_time_s


def _replica_capacity(group: ReplicaGroupConfig, latency: Any) -> float:
    if group.capacity is not None:
        return group.capacity
    seqs = group.engine.max_num_seqs
    step = mean_step_time_s(latency)(0, seqs)
    return seqs / step if step > 0 else float("inf")  # a server whose steps take no time (a test's idealisation)


def plan_fleet(serving: ServingConfig, latency_override: Any = None, streams: Any = None) -> list[ReplicaPlan]:
    """One :class:`ReplicaPlan` per replica, group by group in order.

    *latency_override* replaces every group's latency model (``Simulation(latency_model=...)``).
    A latency model that draws step times (``needs_rng``) gets the stream
    ``latency/<group>`` of *streams* (the simulation's :class:`~simpy_llm.rng.RandomStreams`;
    None, when validating a config: a placeholder stream, never drawn from).

    Raises
    ------
    FieldValueError
        With the key path inside ``serving`` of a setting that cannot be resolved.
    """
    plans = []
    clusters = serving.cluster_of()
    for prefix, group in zip(serving.group_paths(), serving.groups(), strict=True):
        if group.batch_server is not None:
            plans.extend([attrs.evolve(_batch_server_plan(group, latency_override, streams), cluster=clusters.get(group.name, ""))] * group.count)
            continue
        assert group.latency_model is not None  # a continuous-batching group has one (config.serving.check_replica_kind)
        latency = latency_override or build_policy(group.latency_model, latency_models, **_rng(group, streams))
        _check_contract(latency)
        try:
            engine = resolve_engine(group.engine, latency)
        except FieldValueError as exc:
            raise FieldValueError(f"{prefix}engine.{exc.field}", exc.message) from None
        device = None
        if group.device is not None:
            try:
                device, engine = _on_device(group.device, engine, latency)
            except FieldValueError as exc:
                raise FieldValueError(f"{prefix}{exc.field}", exc.message) from None
        hardware = latency.hardware
        try:
            load_s = _load_time_s(group, device, hardware)
        except FieldValueError as exc:
            raise FieldValueError(f"{prefix}{exc.field}", exc.message) from None
        plan = ReplicaPlan(
            group=group.name, engine=engine, latency=latency, capacity=_replica_capacity(group, latency), role=group.role,
            cluster=clusters.get(group.name, ""), device=device, gpus=hardware.gpus if hardware is not None else 1,
            load_s=load_s, warm_retention_s=group.warm_retention_s,
        )
        plans.extend([plan] * group.count)
    return plans


def _check_contract(latency: object) -> None:
    """Refuse, before anything runs, a latency model that lacks a member its callers read."""
    missing = missing_members(latency)
    if missing:
        raise FieldValueError(
            "latency_model",
            f"{type(latency).__name__} lacks {', '.join(missing)}: derive it from "
            "simpy_llm.serving.latency.LatencyModelBase, which gives the optional members their defaults",
        )


def _on_device(name: str, engine: EngineConfig, latency: Any) -> tuple[Any, EngineConfig]:
    """The device profile *name* and *engine* within its KV memory limit, checked against
    the latency model's hardware: the same GPU, a TP degree and pipeline stages the device allows.

    Raises
    ------
    FieldValueError
        Naming ``device`` or ``engine.kv_num_blocks``.
    """
    from simpy_llm.serving.devices import device_profile  # only a group on a named device reads the catalogue

    device = device_profile(name)
    hardware = latency.hardware
    if hardware is not None:
        if device.gpu is not None and device.gpu != hardware.gpu.name:
            raise FieldValueError("device", f"{device.id!r} is a {device.gpu}, but the latency model runs on {hardware.gpu.name}")
        if device.parallelism is not None and hardware.tp > device.parallelism.max_tp:
            raise FieldValueError("device", f"the latency model's tp {hardware.tp} exceeds {device.id!r}'s max_tp {device.parallelism.max_tp}")
        if device.parallelism is not None and device.parallelism.max_pp is not None and hardware.pp > device.parallelism.max_pp:
            raise FieldValueError("device", f"the latency model's pp {hardware.pp} exceeds {device.id!r}'s max_pp {device.parallelism.max_pp}")
    limit_mb = device.memory.kv_cache_limit_mb
    if limit_mb is not None:
        if hardware is None:
            raise FieldValueError(
                "device",
                f"{device.id!r} limits the KV cache to {limit_mb:g} MiB: the latency model must name its model, gpu and tp to size it",
            )
        blocks = int(limit_mb * 2**20 // (hardware.kv_bytes_per_token * engine.kv_block_size))
        assert engine.kv_num_blocks != "auto"  # resolve_engine sized it before the device's limit applies
        if engine.kv_num_blocks > blocks:
            engine = attrs.evolve(engine, kv_num_blocks=blocks)
            if blocks * engine.kv_block_size < engine.max_num_batched_tokens:
                raise FieldValueError(
                    "engine.kv_num_blocks",
                    f"{device.id!r}'s KV limit of {limit_mb:g} MiB holds {blocks} blocks, fewer tokens than max_num_batched_tokens",
                )
    return device, engine


def _load_time_s(group: ReplicaGroupConfig, device: Any, hardware: Any) -> float:
    """A cold start's duration: the device's ``cold_start.load_s`` plus, with ``weights_from``,
    each GPU reading its share of the weights at that source's bandwidth."""
    load_s = device.cold_start.load_s if device is not None and device.cold_start is not None else 0.0
    if group.weights_from is None:
        return load_s
    if hardware is None:
        raise FieldValueError("weights_from", "needs a latency model that names its model, gpu and tp (the weights to load)")
    bandwidth = hardware.gpu.pcie_bandwidth_bytes_per_s if group.weights_from == "host_memory" else LOCAL_NVME_BYTES_PER_S
    return load_s + hardware.weight_bytes_per_gpu / bandwidth


def _rng(group: ReplicaGroupConfig, streams: Any) -> dict[str, Any]:
    """``{"rng": ...}`` for a latency model that draws (see :func:`plan_fleet`), else nothing."""
    if group.latency_model is None or not getattr(latency_models.get(group.latency_model.kind), "needs_rng", False):
        return {}
    if streams is None:
        import numpy as np

        return {"rng": np.random.default_rng(0)}
    return {"rng": streams.stream(f"latency/{group.name}")}


def _batch_server_plan(group: ReplicaGroupConfig, latency_override: Any, streams: Any = None) -> ReplicaPlan:
    """The plan of a batch-server group (its service model is built per replica by the simulation).

    Its capacity, unless given: with a latency model, decode tokens per second of a full
    batch (``n / step_time_s(0, n)``, n the batch size or ``b_max``), the continuous
    engines' unit; without one, 1 (give ``capacity`` in a fleet that mixes kinds).
    """
    latency = None
    capacity = group.capacity
    config = group.batch_server
    assert config is not None  # only batch-server groups are planned here
    if group.latency_model is not None:
        latency = latency_override or build_policy(group.latency_model, latency_models, **_rng(group, streams))
        _check_contract(latency)
        if capacity is None:  # in the continuous engines' unit: decode tokens per second of a full batch
            if config.batch_size is not None:
                n = config.batch_size
            else:
                assert config.dynamic is not None  # a batch server gives batch_size or dynamic (checked when made)
                n = config.dynamic.b_max
            capacity = n / latency.step_time_s(0, n)
    return ReplicaPlan(
        group=group.name, engine=group.engine, latency=latency,
        capacity=capacity if capacity is not None else 1.0, batch_server=config,
    )
