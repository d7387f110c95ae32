"""The catalogue: every measured (model, GPU, TP) latency profile and what else is known of it.

Each row of ``profiles/blis/blackbox_coefficients.csv`` (BLIS's fits on real vLLM runs,
``profiles/blis/NOTICE.md``) is a latency profile by name: ``blis_linear`` with its
``model``, ``gpu`` and ``tp``. :func:`catalogue` lists them with the vLLM version each was
fitted on, the shipped model configuration its model resolves to (``profiles/models``,
directly or through ``aliases.yaml``) and whether the model's weights and KV cache can be
sized on that GPU (which ``kv_num_blocks: auto``, swap and disaggregation need).
``simpy-llm catalogue`` prints the same table. ``docs/latency.md`` ("The catalogue")
lists the models without a configuration and why.
"""

from __future__ import annotations

import csv
import functools

import attrs

from simpy_llm.config.errors import FieldValueError
from simpy_llm.serving.hardware import DEFAULT_ACTIVATION_HEADROOM_BYTES, auto_kv_blocks, canonical_model_name, resolve_hardware
from simpy_llm.serving.profiles import profiles_dir

__all__ = ["CatalogueEntry", "catalogue"]


@attrs.frozen(kw_only=True)
class CatalogueEntry:
    """One measured latency profile: a row of BLIS's coefficients and what it resolves to."""

    model: str
    """The model as BLIS names it (``meta-llama/llama-3.1-8b-instruct``); ``blis_linear``'s ``model``."""
    gpu: str
    """The GPU (``H100``, ``A100-80``); ``blis_linear``'s ``gpu``."""
    tp: int
    """Tensor-parallel degree; ``blis_linear``'s ``tp``."""
    vllm: str
    """The vLLM version the coefficients were fitted on (``v0.8.4``)."""
    model_config: str | None
    """The shipped configuration (``profiles/models/<name>``) the model resolves to, or None."""
    hardware: bool
    """Whether the model's weights and KV cache can be sized on this GPU and TP degree: a
    configuration exists, its heads shard ``tp`` ways, and its weights leave room for KV
    blocks at the defaults of ``kv_num_blocks: auto`` (0.9 of memory, 5.5 GiB headroom)."""


def _sizable(model: str, gpu: str, tp: int) -> bool:
    hardware = resolve_hardware(model, gpu, tp)
    if hardware is None:
        return False
    try:
        auto_kv_blocks(hardware, block_size=16, activation_headroom_bytes=DEFAULT_ACTIVATION_HEADROOM_BYTES)
    except FieldValueError:  # the weights leave no room for the KV cache
        return False
    return True


@functools.cache
def catalogue() -> tuple[CatalogueEntry, ...]:
    """Every BLIS latency profile shipped, in the file's order.

    Returns
    -------
    tuple of CatalogueEntry
        One entry per row of ``profiles/blis/blackbox_coefficients.csv``; ``attrs.asdict``
        turns one into a record (a ``pandas.DataFrame`` takes a list of them).

    Examples
    --------
    >>> rows = catalogue()
    >>> len(rows), len({r.model for r in rows})
    (87, 31)
    >>> r = next(r for r in rows if (r.model, r.gpu, r.tp) == ("meta-llama/llama-3.1-8b-instruct", "H100", 2))
    >>> r.vllm, r.model_config, r.hardware
    ('v0.8.4', 'llama-3.1-8b-instruct', True)
    >>> next(r for r in rows if r.model == "openai/gpt-oss-20b").model_config is None
    True
    """
    entries: list[CatalogueEntry] = []
    with open(profiles_dir() / "blis" / "blackbox_coefficients.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            model, gpu, tp = row["model"], row["gpu"], int(row["tp"])
            entries.append(
                CatalogueEntry(
                    model=model,
                    gpu=gpu,
                    tp=tp,
                    vllm=row["vllm"],
                    model_config=canonical_model_name(model),
                    hardware=_sizable(model, gpu, tp),
                )
            )
    return tuple(entries)
