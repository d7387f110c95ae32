"""Strict structuring of plain data (as YAML gives it) into the frozen config classes.

One cattrs converter forbids unknown keys, refuses silent type coercion (``"3"`` is not an
int, ``1.5`` is not an int, ``true`` is not a number) and rejects NaN/Inf; every problem
becomes a ``(key path, message)`` pair (:class:`Problems`). This module knows no registry:
:func:`tagged` and :func:`build_policy` take the registry to look a name up in, and the
loader (:mod:`simpy_llm.loading`, above the modules that fill the registries) registers the
hooks that name them on :data:`converter`.
"""

from __future__ import annotations

import inspect
import math
import re
import reprlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, get_args, get_origin

import attrs
import cattrs
import numpy as np
import yaml
from cattrs.errors import (
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
)

from simpy_llm.config.errors import FieldValueError, ScenarioError
from simpy_llm.config.schema import PolicySpec, Probability
from simpy_llm.registry import Registry

__all__ = [
    "Problems",
    "Unreadable",
    "build_policy",
    "converter",
    "init_names",
    "problems_of",
    "read_yaml",
    "read_yaml_file",
    "structure_or_problems",
    "tagged",
]


class Problems(Exception):
    """Problems found inside a custom hook, with paths relative to the hooked value."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__(problems)
        self.problems = problems


converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
"""The converter every config goes through (strict: see the module docstring)."""


def _strict_int(value: Any, _t: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Problems([("", f"must be an integer, got {value!r}")])
    return value


def _strict_float(value: Any, _t: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Problems([("", f"must be a number, got {value!r}")])
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        number = math.inf
    if not math.isfinite(number):
        raise Problems([("", f"must be a finite number, got {reprlib.repr(value)}")])
    return number


def _strict_str(value: Any, _t: Any) -> str:
    if not isinstance(value, str):
        raise Problems([("", f"must be a string, got {value!r}")])
    return value


def _strict_bool(value: Any, _t: Any) -> bool:
    if not isinstance(value, bool):
        raise Problems([("", f"must be true or false, got {value!r}")])
    return value


def _injected_only(_given: Any, t: Any) -> Any:
    raise Problems([("", f"a {getattr(t, '__name__', t)} is provided by the simulation, not the scenario")])


def _probability(value: Any, _t: Any) -> float:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    return _strict_float(value, _t)


converter.register_structure_hook(int, _strict_int)
converter.register_structure_hook(Probability, _probability)
converter.register_structure_hook(float, _strict_float)
converter.register_structure_hook(str, _strict_str)
converter.register_structure_hook(bool, _strict_bool)


def init_names(cls: type) -> list[str]:
    """The keys a scenario may give for attrs class *cls* (its ``__init__`` fields)."""
    return [a.name for a in attrs.fields(cls) if a.init]


def attrs_hook_factory(cls: type) -> Any:
    """Structure an attrs class, first insisting on a mapping (so the error says what is allowed)."""
    inner: Callable[[Mapping[str, Any], Any], Any] = converter.gen_structure_attrs_fromdict(cls)
    keys = ", ".join(init_names(cls)) or "none"

    def hook(value: Any, t: Any) -> Any:
        if not isinstance(value, Mapping):
            raise Problems([("", f"must be a mapping with keys: {keys}; got {reprlib.repr(value)}")])
        return inner(value, t)

    return hook


def _is_homogeneous_tuple(t: Any) -> bool:
    args = get_args(t)
    return get_origin(t) is tuple and len(args) == 2 and args[1] is Ellipsis


def _tuple_hook_factory(t: Any) -> Any:
    """``tuple[X, ...]`` from a YAML list (not a string or a mapping), each item's problems at ``[i]``."""
    item_type = get_args(t)[0]

    def hook(value: Any, _t: Any) -> tuple[Any, ...]:
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
            raise Problems([("", f"must be a list of {_describe(item_type)}; got {reprlib.repr(value)}")])
        items: list[Any] = []
        problems: list[tuple[str, str]] = []
        for i, item in enumerate(value):
            try:
                items.append(converter.structure(item, item_type))
            except Exception as exc:  # noqa: BLE001 - reported with its path
                problems += problems_of(exc, f"[{i}]")
        if problems:
            raise Problems(problems)
        return tuple(items)

    return hook


def _dict_hook_factory(t: Any) -> Any:
    """``dict[K, V]`` from a YAML mapping, each value's problems under its key."""
    key_type, value_type = get_args(t) or (Any, Any)

    def hook(value: Any, _t: Any) -> dict[Any, Any]:
        if not isinstance(value, Mapping):
            raise Problems([("", f"must be a mapping of names to {_describe(value_type)}; got {reprlib.repr(value)}")])
        out: dict[Any, Any] = {}
        problems: list[tuple[str, str]] = []
        for k, v in value.items():
            try:
                key = converter.structure(k, key_type)
            except Exception as exc:  # noqa: BLE001 - reported with its path
                problems += problems_of(exc, f"[{k!r}]")
                continue
            try:
                out[key] = converter.structure(v, value_type)
            except Exception as exc:  # noqa: BLE001 - reported with its path
                problems += problems_of(exc, str(k))
        if problems:
            raise Problems(problems)
        return out

    return hook


def _describe(t: Any) -> str:
    if isinstance(t, type) and attrs.has(t):
        return f"mappings with keys: {', '.join(init_names(t)) or 'none'}"
    return getattr(t, "__name__", str(t))


converter.register_structure_hook_factory(lambda t: isinstance(t, type) and attrs.has(t), attrs_hook_factory)
converter.register_structure_hook_factory(_is_homogeneous_tuple, _tuple_hook_factory)
converter.register_structure_hook_factory(lambda t: get_origin(t) is dict, _dict_hook_factory)
# Policies may declare an ``rng`` field; the simulation injects its stream.
converter.register_structure_hook(np.random.Generator, _injected_only)


def problems_of(exc: BaseException, path: str) -> Iterator[tuple[str, str]]:
    """Flatten a (possibly nested) structuring error into (key path, message)."""

    def join(base: str, name: Any) -> str:
        name = str(name)
        if not name:
            return base
        if name.startswith("["):
            return base + name
        return f"{base}.{name}" if base else name

    if isinstance(exc, Problems):
        for sub, msg in exc.problems:
            yield join(path, sub), msg
    elif isinstance(exc, FieldValueError):
        yield join(path, exc.field), exc.message
    elif isinstance(exc, ClassValidationError):
        by_attribute, rest = exc.group_exceptions()
        for sub_exc, attribute in by_attribute:
            yield from problems_of(sub_exc, join(path, attribute.name))
        for sub_exc in rest:
            yield from problems_of(sub_exc, path)
    elif isinstance(exc, IterableValidationError):
        by_index, rest = exc.group_exceptions()
        for sub_exc, item in by_index:
            idx = item.index
            yield from problems_of(sub_exc, join(path, idx) if isinstance(idx, str) else f"{path}[{idx}]")
        for sub_exc in rest:
            yield from problems_of(sub_exc, path)
    elif isinstance(exc, ForbiddenExtraKeysError):
        allowed = (", ".join(init_names(exc.cl)) or "none") if attrs.has(exc.cl) else "?"
        for key in sorted(exc.extra_fields, key=str):
            yield join(path, str(key)), f"unknown key; allowed: {allowed}"
    elif isinstance(exc, KeyError):
        yield path, "required key is missing"
    elif isinstance(exc, BaseExceptionGroup):
        for member in exc.exceptions:
            yield from problems_of(member, path)
    elif isinstance(exc, TypeError):
        yield path, f"wrong type: {exc}"
    else:
        yield path, str(exc)


def structure_or_problems(value: Any, cls: type, prefix: str = "") -> Any:
    try:
        return converter.structure(value, cls)
    except Exception as exc:  # noqa: BLE001 - every structuring failure is reported
        raise Problems(list(problems_of(exc, prefix))) from None


def require_mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise Problems([("", f"must be a mapping ({what}), got {value!r}")])
    return value


def tagged(value: Any, registry: Registry[type], tag: str, flat: bool) -> Any:
    """Structure ``{tag: NAME, ...}`` into the class registered under NAME.

    With *flat* the class's fields sit beside the tag; otherwise under ``params``.
    A class with a ``from_params(fields)`` classmethod builds itself from them
    (its :class:`FieldValueError` is reported under ``params``).
    """
    value = require_mapping(value, f"with key {tag!r}")
    if tag not in value:
        raise Problems([(tag, f"required key is missing; one of: {', '.join(registry.names())}")])
    name = value[tag]
    if not isinstance(name, str) or name not in registry:
        raise Problems([(tag, f"unknown {registry.what} {name!r}; one of: {', '.join(registry.names())}")])
    cls = registry.get(name)
    if flat:
        fields = {k: v for k, v in value.items() if k != tag}
        allowed = [tag, *(a.alias or a.name for a in attrs.fields(cls))] if attrs.has(cls) else [tag]
        extra = sorted(set(value) - set(allowed), key=str)
        if extra:
            raise Problems([(str(extra[0]), f"unknown key for {tag} {name!r}; allowed: {', '.join(allowed)}")])
        prefix = ""
    else:
        extra = sorted(set(value) - {tag, "params"}, key=str)
        if extra:
            raise Problems([(str(extra[0]), f"unknown key; allowed: {tag}, params")])
        params = value.get("params", {})
        if not isinstance(params, Mapping):
            raise Problems([("params", f"must be a mapping (of parameters), got {reprlib.repr(params)}")])
        fields = dict(params)
        prefix = "params"
    if hasattr(cls, "from_params"):  # the class parses its own parameters (e.g. a PMF file)
        try:
            return cls.from_params(fields)
        except Exception as exc:  # noqa: BLE001 - reported with its path
            raise Problems(list(problems_of(exc, prefix))) from None
    try:
        return structure_or_problems(_aliased(cls, fields), cls, prefix)
    except Problems as exc:  # report attribute names under their YAML keys (mean_param -> mean)
        raise Problems([_unaliased(cls, prefix, p, m) for p, m in exc.problems]) from None


def _aliased(cls: type, fields: dict[str, Any]) -> dict[str, Any]:
    """Map YAML keys to attribute names where a field has an alias (``mean`` -> ``mean_param``)."""
    if not attrs.has(cls):
        return fields
    alias_to_name = {a.alias: a.name for a in attrs.fields(cls) if a.alias and a.alias != a.name}
    return {alias_to_name.get(k, k): v for k, v in fields.items()}


def _unaliased(cls: type, prefix: str, path: str, message: str) -> tuple[str, str]:
    """Rewrite attribute names that have a YAML alias back to the alias in a problem."""
    if not attrs.has(cls):
        return path, message
    for a in attrs.fields(cls):
        if a.alias and a.alias != a.name and a.init:
            head = f"{prefix}.{a.name}" if prefix else a.name
            if path == head or path.startswith((head + ".", head + "[")):
                path = (f"{prefix}.{a.alias}" if prefix else a.alias) + path[len(head):]
            message = re.sub(rf"\b{re.escape(a.name)}\b", a.alias, message)
    return path, message


def build_policy(spec: PolicySpec, registry: Registry[type], **inject: Any) -> Any:
    """Instantiate the implementation *spec* names.

    Uses the class's ``from_params(params)`` when it has one; otherwise
    structures ``params`` into an attrs class (strictly), or calls any other
    class (or function) with them as keyword arguments, checked against its
    signature first. Keyword arguments in *inject* are passed to classes that
    declare a field or constructor parameter of that name (e.g. ``rng``); YAML
    may not set them.

    Examples
    --------
    >>> class Threshold:  # a plain class: no attrs needed
    ...     def __init__(self, limit=10, rng=None):
    ...         self.limit, self.rng = limit, rng
    >>> thresholds = Registry("threshold")
    >>> _ = thresholds.register("threshold")(Threshold)
    >>> build_policy(PolicySpec(kind="threshold", params={"limit": 3}), thresholds, rng="stream").limit
    3
    >>> build_policy(PolicySpec(kind="threshold", params={"limt": 3}), thresholds, rng="stream")
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.FieldValueError: limt: unknown parameter of Threshold; accepted: limit
    """
    cls = registry.get(spec.kind)
    if hasattr(cls, "from_params"):
        obj = cls.from_params(dict(spec.params))
    else:
        injected = set(inject)
        bad = sorted(injected & set(spec.params))
        if bad:
            raise FieldValueError(bad[0], "is set by the simulation, not the scenario")
        if not attrs.has(cls):
            return _call_with_params(cls, dict(spec.params), inject)
        obj = converter.structure(dict(spec.params), cls)
    if attrs.has(type(obj)):
        names = attrs.fields_dict(type(obj))
        wanted = {k: v for k, v in inject.items() if k in names}
        if wanted:
            obj = attrs.evolve(obj, **wanted)
    return obj


def _call_with_params(cls: Any, params: dict[str, Any], inject: Mapping[str, Any]) -> Any:
    """``cls(**params)`` for a class that is not an attrs class, its keywords checked first.

    Unknown keywords and missing required ones raise :class:`FieldValueError` naming
    the key; injected values go only to parameters that ask for them by name.
    """
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # no signature to check against (a builtin): let the call decide
        signature = None
    kwargs = dict(params)
    if signature is not None:
        named = {
            name: p
            for name, p in signature.parameters.items()
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        }
        any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
        settable = [name for name in named if name not in inject]
        for key in params:
            if key not in named and not any_keyword:
                what = getattr(cls, "__name__", repr(cls))
                raise FieldValueError(key, f"unknown parameter of {what}; accepted: {', '.join(settable) or 'none'}")
        for name, p in named.items():
            if p.default is inspect.Parameter.empty and name not in params and name not in inject:
                raise FieldValueError(name, "required parameter is missing")
        kwargs.update({k: v for k, v in inject.items() if k in named})
    try:
        return cls(**kwargs)
    except FieldValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - the constructor's own complaint, reported under params
        what = getattr(cls, "__name__", repr(cls))
        raise ValueError(f"{what}({', '.join(sorted(params))}) raised {type(exc).__name__}: {exc}") from exc


class Unreadable(Exception):
    """A YAML file that cannot be read or parsed (the message says why)."""


def read_yaml(path: Path, what: str = "file") -> Any:
    """The data in the YAML file *path* (None when it holds only whitespace and comments)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise Unreadable(f"cannot read {what}: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise Unreadable(f"not valid YAML: {where}{getattr(exc, 'problem', exc)}") from None


def read_yaml_file(path: str | Path, what: str) -> Any:
    """The data in the YAML file *path*, a *what* (``"device profile"``) for messages.

    Raises
    ------
    ScenarioError
        Naming the file when it cannot be read or is not YAML (with the line and column).
    """
    try:
        return read_yaml(Path(path), what)
    except Unreadable as exc:
        raise ScenarioError(str(path), [("", str(exc))], what) from None
