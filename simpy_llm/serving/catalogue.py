"""The catalogue: every measured (model, GPU, TP) latency profile and what else is known of it.

Each row of ``profiles/blis/blackbox_coefficients.csv`` (BLIS's fits on real vLLM runs,
``profiles/blis/NOTICE.md``) is a latency profile by name: ``blis_linear`` with its
``model``, ``gpu`` and ``tp``. :func:`catalogue` lists them with the vLLM version each was
fitted on, the shipped model configuration its model resolves to (``profiles/models``,
directly or through ``aliases.yaml``) and whether the model's weights and KV cache can be
sized on that GPU (which ``kv_num_blocks: auto``, swap and disaggregation need).
``simpy-llm catalogue`` prints the same table. ``docs/latency.md`` ("The catalogue")
lists the models without a configuration and why. :func:`gpu_prices` reads what a GPU costs
per hour (``profiles/gpu_prices.yaml``, or a user's file over it).
"""

from __future__ import annotations

import csv
import functools
import math
from pathlib import Path

import attrs
import yaml

from simpy_llm.config.errors import FieldValueError, ScenarioError
from simpy_llm.serving.hardware import (
    DEFAULT_ACTIVATION_HEADROOM_BYTES,
    auto_kv_blocks,
    canonical_model_name,
    gpu_spec,
    resolve_hardware,
)
from simpy_llm.serving.profiles import profiles_dir

__all__ = ["CatalogueEntry", "catalogue", "gpu_prices"]


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


def _price_problems(raw: object) -> tuple[dict[str, float], list[tuple[str, str]]]:
    """The prices a price table gives, by canonical GPU name, and its problems as (key, message)."""
    if not isinstance(raw, dict):
        got = "an empty file" if raw is None else type(raw).__name__
        return {}, [("", f"must be a mapping of GPU name to US dollars per GPU-hour, got {got}")]
    prices: dict[str, float] = {}
    problems: list[tuple[str, str]] = []
    for key, value in raw.items():
        try:
            name = gpu_spec(key).name
        except FieldValueError as exc:
            problems.append((str(key), exc.message))
            continue
        if name in prices:
            problems.append((str(key), f"names {name}, already priced under another of its names"))
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            problems.append((str(key), f"must be a price in US dollars per GPU-hour, a number > 0, got {value!r}"))
        else:
            prices[name] = float(value)
    return prices, problems


def _read_prices(path: Path) -> dict[str, float]:
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ScenarioError(str(path), [("", f"cannot be read: {exc.strerror or exc}")], what="GPU price table") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(str(path), [("", f"is not valid YAML: {exc}")], what="GPU price table") from None
    prices, problems = _price_problems(raw)
    if problems:
        raise ScenarioError(str(path), problems, what="GPU price table")
    return prices


def gpu_prices(path: str | Path | None = None) -> dict[str, float]:
    """US dollars per GPU-hour by GPU name: the shipped table, with a user's file over it.

    Parameters
    ----------
    path
        A YAML file mapping GPU names (``profiles/gpus.yaml`` names or aliases, any case) to
        prices per GPU-hour; each price it gives replaces the shipped one, the others stay.
        None: the shipped ``profiles/gpu_prices.yaml`` alone (its header names the source
        and the date).

    Raises
    ------
    ScenarioError
        For a file that cannot be read or parsed, that is not a mapping, or whose entry names
        an unknown GPU, names a GPU twice or gives a price that is not a number > 0: every
        problem at once, each at its key.

    Examples
    --------
    >>> gpu_prices()
    {'H100': 3.9492, 'A100-80': 2.4984, 'L40S': 1.9512}
    """
    prices = dict(_shipped_prices())
    if path is not None:
        prices.update(_read_prices(Path(path)))
    return prices


@functools.cache
def _shipped_prices() -> dict[str, float]:
    return _read_prices(profiles_dir() / "gpu_prices.yaml")
