"""Plugins: modules and files named by a scenario, ``--plugin`` or an installed entry point
are imported before the scenario is read, so the policies they register can be named."""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from simpy_llm import Simulation
from simpy_llm.cli import main
from simpy_llm.config import ScenarioError
from simpy_llm.loading import load_plugins, load_scenario, scenario_from_dict
from simpy_llm.loading import plugins as loader_plugins
from simpy_llm.policies.routing import routing_policies
from simpy_llm.policies.scheduling import scheduler_policies

PLUGIN = '''
import attrs

from simpy_llm.policies.routing import routing_policies
from simpy_llm.policies.scheduling import scheduler_policies


@routing_policies.register("kv_aware")
class KvAware:
    """Most free KV blocks (times a weight that changes nothing but shows params arrive)."""

    def __init__(self, weight=1.0):
        self.weight = weight

    def choose(self, request, view):
        return max(range(len(view)), key=lambda i: (view[i].kv_free_blocks * self.weight, -i))


@scheduler_policies.register("longest_prompt_first")
@attrs.define
class LongestPromptFirst:
    def key(self, request, now_s):
        return -request.prompt_tokens
'''


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Registries, imported plugin modules and the entry-point flag as they were before the test."""
    for registry in (routing_policies, scheduler_policies):
        monkeypatch.setattr(registry, "_items", dict(registry._items))  # noqa: SLF001
    monkeypatch.setattr(loader_plugins, "_entry_points_loaded", False)
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith(("_simpy_llm_plugin_", "plugin_fixture_")):
            del sys.modules[name]


def _scenario_data(quickstart_data: dict[str, Any], **top: Any) -> dict[str, Any]:
    data = quickstart_data
    data["workload"]["num_requests"] = 60
    data["serving"]["replicas"] = 2
    data["serving"]["router"] = {"kind": "kv_aware", "params": {"weight": 2.0}}
    data["serving"]["engine"]["scheduler"] = {"kind": "longest_prompt_first"}
    data.update(top)
    return data


def _layout(tmp_path: Path, data: dict[str, Any]) -> tuple[Path, Path]:
    """``conf/s.yaml`` beside ``conf/my_policies.py``; the current directory is *tmp_path*."""
    conf = tmp_path / "conf"
    conf.mkdir()
    plugin = conf / "my_policies.py"
    plugin.write_text(PLUGIN)
    scenario = conf / "s.yaml"
    scenario.write_text(yaml.safe_dump(data))
    return scenario, plugin


def test_plugins_key_imports_a_file_relative_to_the_scenario(
    tmp_path: Path, quickstart_data: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scenario's ``plugins: [my_policies.py]`` is imported (relative to the scenario file,
    not the current directory) before the router and scheduler it registers are looked up,
    and the run uses them with their params."""
    monkeypatch.chdir(tmp_path)
    scenario_file, plugin = _layout(tmp_path, _scenario_data(quickstart_data, plugins=["my_policies.py"]))
    scenario = load_scenario(scenario_file)
    assert scenario.plugins == (str(plugin),)
    sim = Simulation(scenario)
    assert type(sim.routing_policy).__name__ == "KvAware" and sim.routing_policy.weight == 2.0
    assert {type(r.scheduler).__name__ for r in sim.replicas} == {"LongestPromptFirst"}
    assert sim.run().summary()["requests"]["completed"] == 60


def test_without_the_plugin_the_names_are_unknown(tmp_path: Path, quickstart_data: dict) -> None:
    """The same scenario without its plugin names an unknown routing policy (the plugin is what makes it work)."""
    scenario_file, _ = _layout(tmp_path, _scenario_data(quickstart_data))
    with pytest.raises(ScenarioError, match="unknown routing policy 'kv_aware'"):
        load_scenario(scenario_file)


def test_cli_plugin_option_makes_the_policies_known(
    tmp_path: Path, quickstart_data: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--plugin conf/my_policies.py`` (relative to the current directory) lets validate and run
    read a scenario that names the plugin's router and scheduler."""
    monkeypatch.chdir(tmp_path)
    scenario_file, _ = _layout(tmp_path, _scenario_data(quickstart_data))
    assert main(["validate", str(scenario_file), "--plugin", "conf/my_policies.py"]) == 0
    assert main(["run", str(scenario_file), "--plugin", "conf/my_policies.py", "--progress", "off"]) == 0
    out, err = capsys.readouterr()
    assert f"{scenario_file}: ok" in out and "simulated 60 requests" in out
    assert err == ""


def test_a_plugin_may_be_a_module_name(
    tmp_path: Path, quickstart_data: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plugin without a slash or ``.py`` is a module imported from sys.path."""
    (tmp_path / "plugin_fixture_policies.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    scenario = scenario_from_dict(_scenario_data(quickstart_data, plugins=["plugin_fixture_policies"]))
    assert scenario.plugins == ("plugin_fixture_policies",)
    assert scenario.serving.router.kind == "kv_aware"


def test_loading_twice_imports_the_file_once(tmp_path: Path, quickstart_data: dict) -> None:
    """A plugin file runs once per process, however many scenarios name it."""
    conf = tmp_path / "conf"
    scenario_file, plugin = _layout(tmp_path, _scenario_data(quickstart_data, plugins=["my_policies.py"]))
    log = conf / "imports.log"
    plugin.write_text(PLUGIN + f"\nwith open({str(log)!r}, 'a') as fh:\n    fh.write('imported\\n')\n")
    load_scenario(scenario_file)
    load_scenario(scenario_file)
    assert log.read_text().splitlines() == ["imported"]


def test_a_missing_plugin_file_is_reported_at_its_index(tmp_path: Path, quickstart_data: dict) -> None:
    """A plugin path naming no file is a ScenarioError at ``plugins[i]`` naming the plugin and the file."""
    scenario_file, _ = _layout(tmp_path, _scenario_data(quickstart_data, plugins=["my_policies.py", "nope.py"]))
    with pytest.raises(ScenarioError) as info:
        load_scenario(scenario_file)
    assert info.value.paths == ["plugins[1]"]
    assert "cannot import plugin 'nope.py': no such file" in str(info.value)
    assert str(tmp_path / "conf" / "nope.py") in str(info.value)


def test_a_plugin_that_raises_on_import_is_reported_with_its_error(
    tmp_path: Path, quickstart_data: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plugin file or module whose code raises gives a ScenarioError naming the plugin and the
    exception, and leaves no half-imported module behind."""
    (tmp_path / "plugin_fixture_boom.py").write_text("raise RuntimeError('no GPU here')\n")
    (tmp_path / "boom.py").write_text("raise RuntimeError('no GPU here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    data = _scenario_data(quickstart_data, plugins=["plugin_fixture_boom", "boom.py"])
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data, source="s.yaml")
    assert info.value.paths == ["plugins[0]", "plugins[1]"]
    for _, message in info.value.problems:
        assert "RuntimeError: no GPU here" in message
    assert "cannot import plugin 'plugin_fixture_boom'" in str(info.value)
    assert not any(name.startswith("_simpy_llm_plugin_boom") for name in sys.modules)


def test_an_unknown_module_suggests_giving_a_file(tmp_path: Path) -> None:
    """A module name not on sys.path is reported with a hint to give the file's path."""
    with pytest.raises(ScenarioError) as info:
        load_plugins(["plugin_fixture_not_there"], source="s.yaml")
    assert info.value.paths == ["plugins[0]"]
    assert "ModuleNotFoundError" in str(info.value) and "give its path" in str(info.value)


def test_plugins_must_be_a_list_of_strings(quickstart_data: dict) -> None:
    """``plugins`` given as a single string is reported at its key path."""
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict({**quickstart_data, "plugins": "my_policies.py"})
    assert info.value.paths == ["plugins"] and "must be a list" in str(info.value)


def test_cli_bad_plugin_exits_2_naming_it(tmp_path: Path, quickstart_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ``--plugin`` that cannot be imported stops every command with status 2 and names it."""
    missing = tmp_path / "missing.py"
    for command in (["validate", str(quickstart_path)], ["run", str(quickstart_path)]):
        assert main([*command, "--plugin", str(missing)]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert "--plugin[0]: cannot import plugin" in err and str(missing) in err


class _FakeEntryPoint:
    """What ``importlib.metadata.entry_points`` yields: a name, a value and ``load()``."""

    def __init__(self, name: str, value: str, action: Any) -> None:
        self.name, self.value, self.group = name, value, loader_plugins.PLUGIN_ENTRY_POINT_GROUP
        self.action = action
        self.loads = 0

    def load(self) -> Any:
        self.loads += 1
        return self.action()


def _register_acme() -> None:
    @routing_policies.register("acme_router")
    class AcmeRouter:
        def choose(self, request, view):
            return 0


def test_installed_entry_point_plugins_are_imported_once(
    quickstart_data: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry point of group simpy_llm.plugins is loaded before the first scenario is read
    (so its router can be named) and not again for later scenarios."""
    plugin = _FakeEntryPoint("acme", "acme_policies", _register_acme)
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda *, group: [plugin] if group == "simpy_llm.plugins" else []
    )
    quickstart_data["serving"]["router"] = {"kind": "acme_router"}
    assert scenario_from_dict(quickstart_data).serving.router.kind == "acme_router"
    scenario_from_dict(quickstart_data)
    assert plugin.loads == 1


def test_a_failing_entry_point_is_a_scenario_error_and_is_retried(
    quickstart_data: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installed plugin that fails to load is a ScenarioError naming the entry point and the
    error; the next scenario load tries again rather than going on without it."""

    def broken() -> None:
        raise ImportError("acme needs a newer numpy")

    plugin = _FakeEntryPoint("acme", "acme_policies", broken)
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda *, group: [plugin] if group == "simpy_llm.plugins" else []
    )
    for _ in range(2):
        with pytest.raises(ScenarioError) as info:
            scenario_from_dict(quickstart_data, source="s.yaml")
        assert "'acme' = 'acme_policies'" in str(info.value)
        assert "simpy_llm.plugins" in str(info.value) and "ImportError: acme needs a newer numpy" in str(info.value)
    assert plugin.loads == 2


def test_a_real_entry_point_object_imports_its_module(
    tmp_path: Path, quickstart_data: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``importlib.metadata.EntryPoint`` naming a module on sys.path registers its policies."""
    (tmp_path / "plugin_fixture_installed.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    entry_point = importlib.metadata.EntryPoint(
        name="installed", value="plugin_fixture_installed", group="simpy_llm.plugins"
    )
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda *, group: [entry_point] if group == "simpy_llm.plugins" else []
    )
    scenario = scenario_from_dict(_scenario_data(quickstart_data))
    assert (scenario.serving.router.kind, scenario.serving.engine.scheduler.kind) == ("kv_aware", "longest_prompt_first")


# --------------------------------------------------------------------------- plain policy classes


def _register_plain() -> type:
    @routing_policies.register("plain_threshold")
    class PlainThreshold:
        """Replica 0 until it has `limit` outstanding requests, then the least loaded."""

        def __init__(self, limit: int = 4, *, rng=None) -> None:
            if limit < 1:
                raise ValueError(f"limit must be >= 1, got {limit}")
            self.limit, self.rng = limit, rng

        def choose(self, request, view):
            if view[0].outstanding_requests < self.limit:
                return 0
            return min(range(len(view)), key=lambda i: view[i].outstanding_requests)

    return PlainThreshold


def _plain(quickstart_data: dict, params: dict[str, Any] | None = None) -> dict:
    quickstart_data["workload"]["num_requests"] = 50
    quickstart_data["serving"]["replicas"] = 2
    quickstart_data["serving"]["router"] = {"kind": "plain_threshold", **({"params": params} if params is not None else {})}
    return quickstart_data


def test_a_plain_class_is_built_with_its_params_and_injected_rng(quickstart_data: dict) -> None:
    """A policy class without attrs is called with its params as keywords; the rng it asks for is injected."""
    cls = _register_plain()
    sim = Simulation(scenario_from_dict(_plain(quickstart_data, {"limit": 7})))
    assert type(sim.routing_policy) is cls and sim.routing_policy.limit == 7
    assert sim.routing_policy.rng is sim.streams.stream("router")
    assert sim.run().summary()["requests"]["completed"] == 50


def test_a_plain_class_without_params_uses_its_defaults(quickstart_data: dict) -> None:
    """No params: the constructor's defaults apply."""
    _register_plain()
    assert Simulation(scenario_from_dict(_plain(quickstart_data))).routing_policy.limit == 4


def test_an_unknown_param_of_a_plain_class_lists_the_accepted_ones(quickstart_data: dict) -> None:
    """A keyword the constructor does not take is a ScenarioError at ``params.<key>`` listing the
    accepted ones (not cattrs' internal message); injected names are not offered."""
    _register_plain()
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(_plain(quickstart_data, {"limt": 3}))
    assert info.value.paths == ["serving.router.params.limt"]
    assert "unknown parameter of PlainThreshold; accepted: limit" in str(info.value)
    assert "Unsupported type" not in str(info.value)


def test_an_injected_name_in_a_plain_class_params_is_rejected(quickstart_data: dict) -> None:
    """``rng`` in a plain class's params is refused: the simulation sets it."""
    _register_plain()
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(_plain(quickstart_data, {"rng": 1}))
    assert info.value.paths == ["serving.router.params.rng"]


def test_a_plain_class_constructor_error_is_reported_under_params(quickstart_data: dict) -> None:
    """A value the constructor itself rejects is a ScenarioError under ``params`` quoting its message."""
    _register_plain()
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(_plain(quickstart_data, {"limit": 0}))
    assert info.value.paths == ["serving.router.params"]
    assert "ValueError: limit must be >= 1, got 0" in str(info.value)


def test_a_required_param_of_a_plain_class_is_reported_missing(quickstart_data: dict) -> None:
    """A constructor parameter without a default that the scenario leaves out is named as missing;
    a required injected one (``rng``) is not."""

    @routing_policies.register("needs_limit")
    class NeedsLimit:
        def __init__(self, limit, rng) -> None:
            self.limit, self.rng = limit, rng

        def choose(self, request, view):
            return 0

    quickstart_data["serving"]["router"] = {"kind": "needs_limit"}
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(quickstart_data)
    assert info.value.paths == ["serving.router.params.limit"] and "required parameter is missing" in str(info.value)
    quickstart_data["serving"]["router"]["params"] = {"limit": 2}
    assert Simulation(scenario_from_dict(quickstart_data)).routing_policy.limit == 2


def test_a_plain_scheduler_gets_the_slo_targets_it_asks_for(quickstart_data: dict) -> None:
    """A plain scheduler class declaring ``slo`` is given the scenario's TTFT targets."""

    @scheduler_policies.register("plain_deadline")
    class PlainDeadline:
        def __init__(self, slo=None) -> None:
            self.slo = slo

        def key(self, request, now_s):
            return request.arrival_s + self.slo.get(request.slo_class, 1e9)

    quickstart_data["serving"]["engine"]["scheduler"] = {"kind": "plain_deadline"}
    sim = Simulation(scenario_from_dict(quickstart_data))
    assert sim.replicas[0].scheduler.slo == {"interactive": 0.5}
