"""Progress of long runs: when it shows (a pure decision), that Simulation.run and the command
line share one implementation, plain lines without a terminal, and the projection of a run's
wall time and memory (a fake wall clock and fake memory readings: nothing is timed)."""

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
    """On a terminal, run(progress=True) opens the shared bar with the request total, advances
    it to the end, and gives the same records as a run without it."""
    calls: list = []
    monkeypatch.setattr(simulation_module, "watched", lambda: (True, False))
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
    """On a terminal, `simpy-llm run --progress on` draws the same bar as Simulation.run (one
    implementation)."""
    calls: list = []
    monkeypatch.setattr(simulation_module, "watched", lambda: (True, False))
    monkeypatch.setattr(simulation_module, "rich_progress", _recording_bar(calls))
    assert main(["run", str(quickstart_path), "--set", "workload.num_requests=100", "--progress", "on"]) == 0
    assert calls[0] == ("open", 100)
    calls.clear()
    assert main(["run", str(quickstart_path), "--set", "workload.num_requests=100", "--progress", "off"]) == 0
    assert calls == []
    capsys.readouterr()


# --- plain lines without a terminal ----------------------------------------------------
class FakeClock:
    """A wall clock that advances *step_s* seconds each time it is read."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.now = 0.0

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


def test_plain_lines_come_at_a_steady_wall_interval():
    """Read every 3 s over 40 s, a 10 s interval gives a line at the first call at least 10 s
    after the previous one (9 s is too soon: 12, 24, 36 s), each with the requests done, the
    rate since the start and the time left; close adds the last line."""
    import io

    out = io.StringIO()
    clock = FakeClock(3.0)  # read at 3 (start), 6, 9, ...
    lines = progress_module.PlainProgress(1200, stream=out, every_s=10.0, clock=clock)
    for k in range(1, 13):  # calls at 6 .. 39 s; k x 100 requests done
        lines(k * 100, 1200, 10.0 * k)
    lines.close()
    text = out.getvalue().splitlines()
    # lines at 15 s (k=4, 12 s after the start), 27 s (k=8) and 39 s (k=12): 400 / 12 s ...
    assert text == [
        "simulating: t=40 s, 400/1,200 requests (33.3%), 33.3 requests/s, 24 s left",
        "simulating: t=80 s, 800/1,200 requests (66.7%), 33.3 requests/s, 12 s left",
        "simulating: t=120 s, 1,200/1,200 requests (100.0%), 33.3 requests/s, 0.0 s left",
        "simulated: t=120 s, 1,200 requests in 39 s (30.8 requests/s)",
    ]


def test_run_progress_true_without_a_terminal_prints_plain_lines(monkeypatch, capsys):
    """Without a terminal (a log, a pipe), run(progress=True) writes plain lines on standard
    error at the steady interval, and a last line with the requests simulated; the records are
    those of a run without progress."""
    monkeypatch.setattr(simulation_module, "watched", lambda: (False, False))
    monkeypatch.setattr(progress_module, "wall_clock", FakeClock(4.0))
    monkeypatch.setattr(simulation_module, "rich_progress", lambda *_a: pytest.fail("a bar without a terminal"))
    with_lines = _sim().run(progress=True)
    err = capsys.readouterr().err.splitlines()
    progress_lines = [line for line in err if line.startswith("simulating: ")]
    assert progress_lines and all("/300 requests" in line and "requests/s" in line for line in progress_lines)
    assert err[-1].startswith("simulated: ") and ", 300 requests in " in err[-1]
    assert columns_equal(_sim().run(progress=False), with_lines) == []


def test_cli_progress_on_into_a_pipe_prints_lines(monkeypatch, quickstart_path, capsys):
    """`simpy-llm run --progress on` with standard error not a terminal prints progress lines
    (a rich bar there would print nothing)."""
    monkeypatch.setattr(progress_module, "wall_clock", FakeClock(4.0))
    assert main(["run", str(quickstart_path), "--set", "workload.num_requests=200", "--progress", "on"]) == 0
    err = capsys.readouterr().err
    assert "simulating: " in err and "simulated: " in err and "200 requests in" in err


# --- the projection ---------------------------------------------------------------------
class _Stop(Exception):
    pass


def test_an_absurd_run_projects_its_time_and_memory_and_warns(monkeypatch, capsys):
    """num_requests = 2e9: after the two-second warm-up (a clock read every half second) the run
    prints its projected wall time and memory, and warns that the memory exceeds the machine's.
    Memory grows by 500 bytes per request generated (a fake reading), so the whole run needs
    2e9 x 500 B + 50 MB = 1.0 TB, more than the machine's 8 GB. (The progress callback stops
    the run once the projection is out.)"""
    sim = Simulation(load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=2000000000"]))
    monkeypatch.setattr(progress_module, "wall_clock", FakeClock(0.5))
    monkeypatch.setattr(progress_module, "resident_memory_bytes", lambda: 50_000_000 + 500 * sim.generator.generated)
    monkeypatch.setattr(progress_module, "machine_memory_bytes", lambda: 8_000_000_000)
    seen = []

    def stop_after_the_projection(done, total, now):
        seen.append(capsys.readouterr().err)
        if "projection:" in seen[-1]:
            raise _Stop
        assert len(seen) < 200, "no projection after 200 slices (100 s on the clock)"

    with pytest.raises(_Stop):
        sim.run(progress=stop_after_the_projection, progress_every_s=1.0)
    assert len(seen) <= 6  # the warm-up: 2 s on the clock, half a second per slice
    projection, warning = seen[-1].splitlines()
    assert projection.startswith("projection: the whole run would take about ")
    assert " of wall time and 1.0 TB of memory (measured over its first 2." in projection
    assert warning == (
        "warning: 1.0 TB is more memory than this machine has (8.0 GB): the run would fail or swap long before it ends"
    )


@pytest.mark.parametrize(("step_s", "printed"), [(1000.0, True), (0.01, False)], ids=["long", "short"])
def test_left_automatic_a_long_run_prints_its_projection_only_when_long(monkeypatch, capsys, step_s, printed):
    """With progress automatic and nobody watching, a run expected to be long (2e9 requests,
    stopped by simulation.until_s = 100 s) prints its projection when it projects a minute or
    more (a clock read every 1000 s), and nothing when it projects less (every 10 ms); its
    records are those of a run without progress."""
    overrides = ["workload.num_requests=2000000000", "simulation.until_s=100"]
    monkeypatch.setattr(simulation_module, "watched", lambda: (False, False))
    monkeypatch.setattr(progress_module, "wall_clock", FakeClock(step_s))
    results = Simulation(load_scenario("scenarios/quickstart.yaml", overrides)).run()
    err = capsys.readouterr().err
    assert ("projection: the whole run would take about" in err) is printed
    assert "warning:" not in err
    plain = Simulation(load_scenario("scenarios/quickstart.yaml", overrides)).run(progress=False)
    assert columns_equal(plain, results) == []


def test_progress_false_makes_no_projection(monkeypatch, capsys):
    """run(progress=False) never projects, however long the run would be."""
    monkeypatch.setattr(progress_module, "wall_clock", lambda: pytest.fail("the wall clock was read"))
    Simulation(load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=2000000000", "simulation.until_s=20"])).run(progress=False)
    assert capsys.readouterr().err == ""


def test_a_callable_sees_slices_fixed_in_simulated_time(monkeypatch):
    """A progress callable is called every 1/200 of the expected duration (300 requests at
    20/s: every 0.075 simulated seconds), whatever the wall clock says: a callback that acts on
    what it sees (a capacity probe stopping an overloaded run) acts the same on any machine."""
    monkeypatch.setattr(progress_module, "wall_clock", FakeClock(1000.0))
    seen: list[float] = []
    _sim().run(progress=lambda done, total, now: seen.append(now))
    assert seen[:4] == pytest.approx([0.075, 0.15, 0.225, 0.3], rel=1e-12)
