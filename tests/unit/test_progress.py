"""Progress bars: when they show (a pure decision), and that Simulation.run and the
command line share one implementation."""

from __future__ import annotations

import sys
import types
from contextlib import contextmanager

import pytest

import simpy_llm.progress as progress_module
import simpy_llm.simulation as simulation_module
from simpy_llm import Simulation, load_scenario
from simpy_llm.cli import main
from simpy_llm.progress import AUTO_MIN_REQUESTS, in_jupyter_kernel, progress_wanted, watched

from tests.helpers import columns_equal

LONG = AUTO_MIN_REQUESTS
SHORT = AUTO_MIN_REQUESTS - 1


# --- the decision -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("terminal", "jupyter", "expected", "shown"),
    [
        (True, False, LONG, True),
        (False, True, LONG, True),
        (True, True, LONG, True),
        (False, False, LONG, False),  # a pipe, a log file, a test
        (True, False, SHORT, False),  # over too soon to need a bar
        (False, True, 0, False),  # unknown size (a trace replay)
    ],
)
def test_automatic_progress_needs_a_watcher_and_a_long_run(terminal, jupyter, expected, shown):
    """With no setting, a bar shows only for a terminal or a Jupyter kernel, and only when
    at least AUTO_MIN_REQUESTS requests are expected."""
    assert progress_wanted(None, terminal=terminal, jupyter=jupyter, expected_requests=expected) is shown


@pytest.mark.parametrize("setting", [True, False])
def test_an_explicit_setting_overrides_the_detection(setting):
    """True or False wins whatever the environment and size."""
    for terminal in (True, False):
        for expected in (0, LONG):
            assert progress_wanted(setting, terminal=terminal, jupyter=False, expected_requests=expected) is setting


def test_plain_python_is_not_a_jupyter_kernel(monkeypatch):
    """Without IPython imported, or with IPython but no running shell, there is no kernel."""
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    assert in_jupyter_kernel() is False
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: None))
    assert in_jupyter_kernel() is False


def test_an_ipython_terminal_is_not_a_kernel(monkeypatch):
    """A terminal IPython shell has no kernel (its terminal is detected as a terminal)."""
    shell = types.SimpleNamespace()
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    assert in_jupyter_kernel() is False


@pytest.mark.parametrize("widgets", [True, False])
def test_a_kernel_counts_when_it_can_draw_widgets(monkeypatch, widgets):
    """A shell with a kernel is a Jupyter kernel that can show the bar iff ipywidgets is installed."""
    shell = types.SimpleNamespace(kernel=object())
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    real_find_spec = progress_module.importlib.util.find_spec
    monkeypatch.setattr(
        progress_module.importlib.util,
        "find_spec",
        lambda name, *a: (object() if widgets else None) if name == "ipywidgets" else real_find_spec(name, *a),
    )
    assert in_jupyter_kernel() is widgets


def test_watched_reads_the_stream_isatty(monkeypatch):
    """terminal is the stream's isatty(); a stream without one, or closed, is no terminal."""
    monkeypatch.delitem(sys.modules, "IPython", raising=False)

    class Tty:
        def isatty(self) -> bool:
            return True

    class Closed:
        def isatty(self) -> bool:
            raise ValueError("I/O operation on closed file")

    assert watched(Tty()) == (True, False)
    assert watched(object()) == (False, False)
    assert watched(Closed()) == (False, False)


# --- Simulation.run ------------------------------------------------------------------
def _recording_bar(calls: list):
    """A stand-in for rich_progress that records its total and every update in *calls*."""

    @contextmanager
    def fake(total):
        calls.append(("open", total))
        yield lambda done, _total, now: calls.append(("update", done, now))

    return fake


def _sim(n: int = 300) -> Simulation:
    return Simulation(load_scenario("scenarios/quickstart.yaml", [f"workload.num_requests={n}"]))


def test_run_progress_false_never_touches_rich(monkeypatch):
    """run(progress=False) neither imports rich nor asks whether anyone watches."""
    for name in [m for m in sys.modules if m == "rich" or m.startswith("rich.")] + ["rich"]:
        monkeypatch.setitem(sys.modules, name, None)  # any import of rich now raises ImportError

    def forbidden(*_args, **_kwargs):
        raise AssertionError("progress machinery used with progress=False")

    monkeypatch.setattr(simulation_module, "rich_progress", forbidden)
    monkeypatch.setattr(simulation_module, "watched", forbidden)
    results = _sim().run(progress=False)
    assert len(results) == 300


def test_run_progress_true_draws_the_shared_bar_without_changing_records(monkeypatch):
    """run(progress=True) opens the shared bar with the request total, advances it to the
    end, and gives the same records as a run without it."""
    calls: list = []
    monkeypatch.setattr(simulation_module, "rich_progress", _recording_bar(calls))
    with_bar = _sim().run(progress=True)
    plain = _sim().run(progress=False)
    assert calls[0] == ("open", 300)
    assert calls[-1][:2] == ("update", 300)
    assert len(calls) > 10
    assert columns_equal(plain, with_bar) == []


def test_run_auto_asks_the_detection_with_the_expected_requests(monkeypatch):
    """run() with no setting passes what it detected and the expected request count to
    progress_wanted, and shows the bar when that says so."""
    seen: dict = {}
    calls: list = []

    def decide(setting, **kwargs):
        seen.update(kwargs, setting=setting)
        return True

    monkeypatch.setattr(simulation_module, "watched", lambda: (True, False))
    monkeypatch.setattr(simulation_module, "progress_wanted", decide)
    monkeypatch.setattr(simulation_module, "rich_progress", _recording_bar(calls))
    _sim(120).run()
    assert seen == {"setting": None, "terminal": True, "jupyter": False, "expected_requests": 120}
    assert calls[0] == ("open", 120)


def test_run_auto_opens_no_bar_for_a_short_run_even_on_a_terminal(monkeypatch):
    """Left alone, a run expected to be short opens no bar, whoever watches."""
    monkeypatch.setattr(simulation_module, "watched", lambda: (True, True))
    monkeypatch.setattr(simulation_module, "rich_progress", lambda *_a: pytest.fail("a bar was opened"))
    assert len(_sim(50).run()) == 50


def test_the_real_bar_runs_on_a_console(monkeypatch):
    """rich_progress draws on the given console and its callback accepts updates."""
    import io

    from rich.console import Console

    out = io.StringIO()
    with progress_module.rich_progress(10, console=Console(file=out, force_terminal=True, width=80)) as update:
        update(5, 10, 1.0)
        update(10, 10, 2.0)
    assert "10/10" in out.getvalue()


def test_cli_run_uses_the_shared_bar(monkeypatch, quickstart_path, capsys):
    """`simpy-llm run --progress on` draws the same bar as Simulation.run (one implementation)."""
    calls: list = []
    monkeypatch.setattr(simulation_module, "rich_progress", _recording_bar(calls))
    assert main(["run", str(quickstart_path), "--set", "workload.num_requests=100", "--progress", "on"]) == 0
    assert calls[0] == ("open", 100)
    calls.clear()
    assert main(["run", str(quickstart_path), "--set", "workload.num_requests=100", "--progress", "off"]) == 0
    assert calls == []
    capsys.readouterr()
