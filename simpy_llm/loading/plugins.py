"""Plugins: modules a scenario names (``plugins:``) and those installed under the
``simpy_llm.plugins`` entry-point group, imported before a scenario's names are looked up
so that the policies and models they register are known."""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from simpy_llm.config.errors import ScenarioError
from simpy_llm.config.paths import resolve_path
from simpy_llm.config.schema import is_plugin_path

__all__ = ["PLUGIN_ENTRY_POINT_GROUP", "import_plugins_of", "load_entry_point_plugins", "load_plugins"]


PLUGIN_ENTRY_POINT_GROUP = "simpy_llm.plugins"
"""Entry-point group whose members are imported once, before the first scenario is loaded."""

_entry_points_loaded = False


def load_plugins(plugins: Sequence[str], source: str = "<plugins>", key: str = "plugins") -> list[ModuleType]:
    """Import each plugin so that the names it registers are known.

    A plugin is a module name (``my_package.policies``, found on ``sys.path``) or
    a Python file (``my_policies.py`` or any path with a ``/``): relative to the
    scenario file's directory while a scenario is loaded, else to the current
    directory. Each module or file is imported once per process; importing it
    again returns the module already imported.

    Raises
    ------
    ScenarioError
        Naming ``<key>[i]``, the plugin and the import error, for every plugin
        that cannot be imported.

    Examples
    --------
    >>> [m.__name__ for m in load_plugins(["json", "collections.abc"])]
    ['json', 'collections.abc']
    >>> load_plugins(["no_such_module_here"], source="demo.yaml")
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.ScenarioError: demo.yaml: 1 problem(s) in scenario
      plugins[0]: cannot import plugin 'no_such_module_here': ModuleNotFoundError: ...
    """
    modules, problems = [], []
    for i, plugin in enumerate(plugins):
        where = f"{key}[{i}]"
        if not isinstance(plugin, str) or not plugin.strip():
            problems.append((where, f"must be a module name or a Python file, got {plugin!r}"))
            continue
        try:
            modules.append(_import_file(plugin) if is_plugin_path(plugin) else importlib.import_module(plugin))
        except _PluginFileMissing as exc:
            problems.append((where, f"cannot import plugin {plugin!r}: no such file: {exc}"))
        except Exception as exc:  # noqa: BLE001 - any failure of the plugin's own code is reported
            hint = ""
            if isinstance(exc, ModuleNotFoundError) and exc.name == plugin.split(".")[0]:
                hint = " (not on sys.path; for a file, give its path, e.g. my_policies.py)"
            problems.append((where, f"cannot import plugin {plugin!r}: {type(exc).__name__}: {exc}{hint}"))
    if problems:
        raise ScenarioError(source, problems)
    return modules


class _PluginFileMissing(Exception):
    """A plugin path that names no file."""


def _import_file(path_text: str) -> ModuleType:
    """Import a Python file as a module named after its absolute path (once per process)."""
    path = Path(resolve_path(path_text)).resolve()
    if not path.is_file():
        raise _PluginFileMissing(str(path))
    stem = re.sub(r"\W", "_", path.stem)
    name = f"_simpy_llm_plugin_{stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it, as import does (attrs and dataclasses look it up)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_entry_point_plugins(source: str = "<plugins>") -> None:
    """Import the plugins installed under the ``simpy_llm.plugins`` entry-point group.

    Runs once per process: later calls return at once. A package declares its
    plugin module in its ``pyproject.toml``::

        [project.entry-points."simpy_llm.plugins"]
        my_policies = "my_package.policies"

    Raises
    ------
    ScenarioError
        Naming each entry point that cannot be loaded and why (the next call tries again).
    """
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    problems = []
    for entry_point in importlib.metadata.entry_points(group=PLUGIN_ENTRY_POINT_GROUP):
        try:
            entry_point.load()
        except Exception as exc:  # noqa: BLE001 - an installed plugin's failure is reported
            problems.append(
                ("", f"cannot load plugin {entry_point.name!r} = {entry_point.value!r} "
                     f"(entry point group {PLUGIN_ENTRY_POINT_GROUP}): {type(exc).__name__}: {exc}")
            )
    if problems:
        raise ScenarioError(source, problems)
    _entry_points_loaded = True


def import_plugins_of(data: Mapping[str, Any], source: str) -> None:
    """Import the installed plugins and those *data* names, before its policies are looked up."""
    load_entry_point_plugins(source)
    plugins = data.get("plugins")
    # a malformed list is left to the structuring, which reports it at its key path
    if isinstance(plugins, (list, tuple)) and all(isinstance(p, str) for p in plugins):
        load_plugins(plugins, source)
