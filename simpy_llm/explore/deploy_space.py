"""The space of :func:`~simpy_llm.explore.deploy.deploy`: its axes, each value checked, and
its configurations in order (:func:`_space`): the catalogue's rows of the model on the GPUs
and TP degrees given, at each pipeline degree (:func:`_stages` checks the roofline can
take it), the calibrated profiles standing in for rows (:func:`_profiles`),
the disaggregated pairs of rows, crossed with the engine settings and speculation's arms
(:func:`_draft_cost` prices its draft devices). Errors name the argument at fault."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simpy_llm.config.errors import ScenarioError
from simpy_llm.explore.deploy_results import Configuration, Pool

if TYPE_CHECKING:
    from simpy_llm.serving.catalogue import CatalogueEntry


def _axis(name: str, values: Iterable[Any] | None, default: Any, check: Callable[[Any], bool], allowed: str) -> list[Any]:
    """The values of one axis of the space (the scenario's own when None), each checked."""
    if values is None:
        return [default]
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a list, got {values!r}")
    out = list(dict.fromkeys(values))
    if not out:
        raise ValueError(f"{name} is empty: give at least one value, or None for the scenario's own")
    for v in out:
        if not check(v):
            raise ValueError(f"{name}: {v!r} is not allowed; allowed: {allowed}")
    return out


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _model_of(loaded: Any, model: str | None) -> str:
    if model is not None:
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a model name, got {model!r}")
        return model
    spec = loaded.serving.latency_model
    named = None if spec is None else spec.params.get("model")
    if not isinstance(named, str):
        raise ValueError("the scenario's latency model names no model (serving.latency_model.params.model): "
                         "give model= (--model), a model of the catalogue (simpy-llm catalogue)")
    return named


def _names_model(loaded: Any) -> bool:
    """Whether the scenario's latency model names its model."""
    spec = loaded.serving.latency_model
    return spec is not None and isinstance(spec.params.get("model"), str)


def _gpus(argument: str, gpus: Sequence[str], prices: Mapping[str, float]) -> list[str]:
    """The GPUs *argument* names, canonical, each with a price."""
    from simpy_llm.config.errors import FieldValueError
    from simpy_llm.serving.hardware import gpu_names, gpu_spec

    names = [] if isinstance(gpus, (str, bytes)) or not isinstance(gpus, Iterable) else list(gpus)
    if not names:
        raise ValueError(f"{argument} must be a non-empty list of GPU names, got {gpus!r}; known GPUs: {', '.join(gpu_names())}")
    wanted: list[str] = []
    for name in names:
        try:
            canonical = gpu_spec(name).name
        except FieldValueError:
            raise ValueError(f"{argument}: unknown GPU {name!r}; known GPUs: {', '.join(gpu_names())}") from None
        if canonical not in prices:
            raise ValueError(f"{argument}: no price for {canonical} in the price table (it has: {', '.join(prices)}); "
                             "give a price file with it (prices=, --prices)")
        wanted.append(canonical)
    return list(dict.fromkeys(wanted))


def _rows(model: str, wanted: list[str], tps: list[int] | None) -> list[CatalogueEntry]:
    """The catalogue rows of *model* on the GPUs *wanted* and the TP degrees *tps*."""
    from simpy_llm.serving.catalogue import catalogue

    m = model.lower()
    of_model = [r for r in catalogue() if m in (r.model.lower(), r.model.lower().split("/", 1)[-1])]
    if not of_model:
        known = sorted({r.model.split("/", 1)[-1] for r in catalogue()})
        raise ValueError(f"no catalogue row for model {model!r}; the catalogue's models: {', '.join(known)}")
    rows = [r for r in of_model if r.gpu in wanted and (tps is None or r.tp in tps)]
    if not rows:
        has = ", ".join(f"{r.gpu} tp{r.tp}" for r in of_model)
        raise ValueError(f"no catalogue row for model {model!r} on {', '.join(wanted)}"
                         + ("" if tps is None else f" with tp in {tps}") + f"; it has: {has}")
    return rows


def _space(
    loaded: Any, model: str, gpus: Sequence[str], tp: Iterable[int] | None, schedulers: Iterable[str] | None,
    max_num_seqs: Iterable[int] | None, max_num_batched_tokens: Iterable[int] | None,
    chunked_prefill: Iterable[bool] | None, prices: Mapping[str, float],
    pools: tuple[Sequence[str], Sequence[str]] | None = None, speculation: Iterable[bool] | None = None,
    profiles: list[tuple[str, str, str, int]] | None = None, pp: Iterable[int] | None = None,
) -> list[Configuration]:
    """Every configuration of the space, in its order (errors name the argument at fault):
    the co-located ones (the catalogue's rows at each degree of *pp* in turn, default 1
    only, then the calibrated *profiles*' ``(name,
    file, GPU, TP)``), then with *pools* (the prefill and decode pools' GPUs) every (prefill
    row, decode row) pair's; with *speculation*, each with and without the scenario's
    speculative decoding."""
    from simpy_llm.policies.scheduling import scheduler_policies

    wanted = _gpus("gpus", gpus, prices)
    prefill, decode = (None, None) if pools is None else (_gpus("prefill_gpus", pools[0], prices), _gpus("decode_gpus", pools[1], prices))
    tps = None if tp is None else _axis("tp", tp, None, _positive_int, "integers >= 1")
    pps: list[int] = _axis("pp", pp, 1, _positive_int, "integers >= 1")
    engine = loaded.serving.engine
    axes = [
        _axis("schedulers", schedulers, engine.scheduler.kind, lambda v: isinstance(v, str) and v in scheduler_policies,
              ", ".join(scheduler_policies.names())),
        _axis("max_num_seqs", max_num_seqs, engine.max_num_seqs, _positive_int, "integers >= 1"),
        _axis("max_num_batched_tokens", max_num_batched_tokens, engine.max_num_batched_tokens, _positive_int,
              "integers >= 1"),
        _axis("chunked_prefill", chunked_prefill, engine.chunked_prefill, lambda v: isinstance(v, bool), "True, False"),
        _axis("speculation", speculation, None, lambda v: isinstance(v, bool), "True, False"),
    ]
    draft = _draft_cost(loaded) if True in axes[-1] else 0.0
    try:
        rows = _rows(model, wanted, tps)
    except ValueError as exc:
        if not (profiles and str(exc).startswith(f"no catalogue row for model {model!r};")):
            raise
        rows = []  # a model the catalogue lacks: its calibrated profiles are its rows
    pairs = [] if prefill is None or decode is None else [
        (p, d) for p in _rows(model, prefill, tps) for d in _rows(model, decode, tps)]
    given = tuple(name for name, values in (("scheduler", schedulers), ("max_num_seqs", max_num_seqs),
                                            ("max_num_batched_tokens", max_num_batched_tokens),
                                            ("chunked_prefill", chunked_prefill)) if values is not None)
    if pps != [1] and not rows:
        raise ValueError(f"pp: pipeline stages split a catalogue row of the model, and {model!r} has none "
                         "(calibrated profiles have no pipeline figures); give pp=None (no --pp)")
    cells: list[dict[str, Any]] = []
    for stages in pps:
        if stages == 1:
            cells += [{"model": r.model, "gpu": r.gpu, "tp": r.tp, "price_per_gpu_hour": prices[r.gpu],
                       "kv_auto": r.hardware} for r in rows]
        else:  # the calibrated roofline sizes the KV cache from the GPU's memory (kv_num_blocks: auto)
            cells += [{"model": r.model, "gpu": r.gpu, "tp": r.tp, "price_per_gpu_hour": prices[r.gpu],
                       "kv_auto": True, "pp": _stages(r, stages)} for r in rows]
    cells += [{"model": rows[0].model if rows else model, "gpu": gpu, "tp": n, "price_per_gpu_hour": prices[gpu],
               "kv_auto": False, "profile": name, "profile_file": file, "engine_keys": given}
              for name, file, gpu, n in profiles or []]
    cells += [{"model": r.model, "gpu": r.gpu, "tp": r.tp, "price_per_gpu_hour": prices[r.gpu], "kv_auto": r.hardware,
               "decode": Pool(gpu=d.gpu, tp=d.tp, price_per_gpu_hour=prices[d.gpu], kv_auto=d.hardware)} for r, d in pairs]
    space: list[Configuration] = []
    for cell in cells:
        for scheduler, seqs, tokens, chunked, spec in itertools.product(*axes):
            space.append(Configuration(
                index=len(space), scheduler=scheduler, max_num_seqs=seqs, max_num_batched_tokens=tokens,
                chunked_prefill=chunked, speculation=spec, draft_cost_per_hour=draft if spec else 0.0, **cell,
            ))
    return space


def _stages(row: CatalogueEntry, pp: int) -> int:
    """*pp*, checked against what the calibrated roofline of *row*'s model, GPU and TP takes:
    a shipped model configuration, calibrated efficiencies for the GPU, at most one stage per
    decoder layer (an uneven split is vLLM's, ``docs/latency.md``)."""
    from simpy_llm.serving.hardware import resolve_hardware
    from simpy_llm.serving.roofline import calibrated_efficiencies

    hardware = resolve_hardware(row.model, row.gpu, row.tp)
    if hardware is None:
        raise ValueError(f"pp: {pp} stages run the roofline, which needs the model's shape, and {row.model} has no "
                         "shipped model configuration (profiles/models); give pp=[1] (--pp 1) for its catalogue rows")
    table = calibrated_efficiencies()
    if row.gpu not in table:
        raise ValueError(f"pp: {pp} stages run the calibrated roofline, and {row.gpu} has no calibrated efficiencies "
                         f"(calibrated GPUs: {', '.join(sorted(table))})")
    layers = hardware.model.num_layers
    if pp > layers:
        raise ValueError(f"pp: {pp} stages are more than {row.model}'s {layers} decoder layers; allowed: 1 to {layers}")
    return pp


def _profiles(profiles: Mapping[str, Mapping[str, Any]] | None, prices: Mapping[str, float]) -> list[tuple[str, str, str, int]]:
    """The calibrated profiles standing in for catalogue rows, ``(name, file, GPU, TP)``,
    each file read and checked (errors name ``profiles[NAME]`` and the key at fault)."""
    from simpy_llm.config.profile import load_profile

    if profiles is None:
        return []
    if not isinstance(profiles, Mapping) or not profiles:
        raise ValueError(f"profiles must be a non-empty mapping {{NAME: {{file: FILE, gpu: GPU, tp: N}}}}, got {profiles!r}")
    out = []
    for name, spec in profiles.items():
        where = f"profiles[{name!r}]"
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{where}: a profile's name must be a non-empty string")
        if not isinstance(spec, Mapping) or set(spec) - {"file", "gpu", "tp"} or not {"file", "gpu"} <= set(spec):
            raise ValueError(f"{where} must be {{file: FILE, gpu: GPU}} and optionally tp: N, got {spec!r}")
        tp = spec.get("tp", 1)
        if not _positive_int(tp):
            raise ValueError(f"{where}.tp must be an integer >= 1, got {tp!r}")
        try:
            load_profile(spec["file"])
        except ScenarioError as exc:
            problems = "; ".join(f"{path}: {message}" if path else message for path, message in exc.problems)
            raise ValueError(f"{where}.file: {spec['file']} is not a profile: {problems}") from None
        (gpu,) = _gpus(f"{where}.gpu", [spec["gpu"]], prices)
        out.append((name, str(Path(spec["file"]).resolve()), gpu, tp))
    return out


def _draft_cost(loaded: Any) -> float:
    """US dollars per hour of the scenario's draft devices: each draft group's count times
    its device profile's ``price_per_hour_usd`` (none without a device or a price: a user's
    phone). A fused draft runs on the target's GPU and adds nothing.

    Raises
    ------
    ValueError
        If the scenario has no speculation to switch on.
    """
    from simpy_llm.serving.devices import device_profile

    spec = loaded.speculation
    if spec is None:
        raise ValueError("speculation: True (on) runs the scenario's speculation block, and the scenario has none "
                         "(docs/speculative.md); give speculation=None (no --speculation) or a scenario with one")
    if spec.mode == "fused":
        return 0.0
    total = 0.0
    for group in spec.drafts:
        price = None if group.device is None else device_profile(group.device).price_per_hour_usd
        total += group.count * (price or 0.0)
    return total
