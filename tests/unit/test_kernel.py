"""The kernel: SimPy operations at exact absolute times, born-processed events, moved
waits, the event count, the Environment and Channel built on them, and the contract
check that names the SimPy internal that changed."""

from __future__ import annotations

import pytest
import simpy
import simpy.core
import simpy.events
import simpy.resources.base
from simpy.core import BoundClass
from simpy.resources.base import Get

from simpy_llm import kernel
from simpy_llm.kernel import (
    CHECKED_SIMPY,
    LATE,
    Channel,
    Environment,
    Later,
    ProcessedEvent,
    SimPyContractError,
    check_simpy,
    events_scheduled,
    move_wait,
    schedule_at,
    succeed_at,
    timer_at,
)


def test_late_is_the_priority_after_normal():
    """LATE is 2, after SimPy's URGENT (0) and NORMAL (1); the engine re-exports it."""
    from simpy_llm.serving.engine import LATE as ENGINE_LATE

    assert (simpy.events.URGENT, simpy.events.NORMAL, LATE) == (0, 1, 2)
    assert ENGINE_LATE is LATE


def test_timer_at_fires_at_the_exact_time_after_normal_events():
    """A timer at an absolute time like 0.1 + 0.2 fires at exactly that float, where a
    timeout of the difference lands elsewhere, and after the NORMAL events of that instant
    (even those scheduled after it)."""
    env = simpy.Environment()
    env.run(until=1.1)
    at = 5.2
    assert 1.1 + (at - 1.1) != at  # a timeout of the difference would miss it
    order = []
    timer_at(env, at).callbacks.append(lambda ev: order.append(("timer", env.now)))
    env.timeout(at - 1.1).callbacks.append(lambda ev: order.append(("timeout", env.now)))
    env.run(until=4.0)
    ev = env.timeout(at - 4.0)
    assert env.now + (at - 4.0) == at
    ev.callbacks.append(lambda ev: order.append(("normal", env.now)))
    env.run()
    assert order == [("timeout", 1.1 + (at - 1.1)), ("normal", at), ("timer", at)]

    env = simpy.Environment()
    seen = []
    env.run(until=0.1)
    timer_at(env, 0.1 + 0.2).callbacks.append(lambda ev: seen.append(env.now))
    env.run()
    assert seen == [0.1 + 0.2]


def test_later_fires_where_and_when_a_timeout_with_its_callback_does():
    """Later(env, d, cb) fires at now + d at NORMAL priority, in the order its event id gives
    among timeouts of the same instant (made before and after it), and calls cb with itself."""
    env = simpy.Environment()
    env.run(until=0.1)
    order = []
    env.timeout(0.2).callbacks.append(lambda ev: order.append(("before", env.now)))
    later = Later(env, 0.2, lambda ev: order.append(("later", env.now, ev)))
    env.timeout(0.2).callbacks.append(lambda ev: order.append(("after", env.now)))
    timer_at(env, 0.1 + 0.2).callbacks.append(lambda ev: order.append(("late", env.now)))
    assert events_scheduled(env) == 6  # one id each, as a timeout takes (the stop of the run took two)
    env.run()
    t = 0.1 + 0.2
    assert order == [("before", t), ("later", t, later), ("after", t), ("late", t)]
    assert later.processed and later.ok and later.value is None


def test_timer_at_a_passed_time_fires_now():
    """A timer at a time already passed fires now (at LATE priority), not in the past."""
    env = simpy.Environment()
    env.run(until=3.0)
    timer = timer_at(env, 1.0)
    env.run()
    assert timer.processed and env.now == 3.0


def test_schedule_at_puts_a_triggered_event_at_an_absolute_time_late():
    """A triggered, unscheduled event is processed at the absolute time given, after the
    NORMAL events of that instant."""

    class Ready(simpy.events.Event):
        def __init__(self, env: simpy.Environment) -> None:
            super().__init__(env)
            self._ok, self._value = True, "ready"

    env = simpy.Environment()
    env.run(until=1.1)
    order = []
    ready = Ready(env)
    ready.callbacks.append(lambda ev: order.append((ev.value, env.now)))
    schedule_at(env, ready, 5.2)
    env.timeout(5.2 - 1.1).callbacks.append(lambda ev: order.append(("timeout", env.now)))
    env.run()
    assert order == [("timeout", 1.1 + (5.2 - 1.1)), ("ready", 5.2)]


def test_succeed_at_succeeds_a_pending_event_at_late_priority():
    """succeed_at gives a pending event its value and processes it at the time given after
    that instant's NORMAL events; a waiting process gets the value; succeeding it again
    fails as Event.succeed does."""
    env = simpy.Environment()
    signal = env.event()
    order = []

    def waiter():
        value = yield signal
        order.append(("waiter", value, env.now))

    env.process(waiter())
    env.run(until=1.0)
    assert succeed_at(env, signal, 2.0, "wake") is signal
    assert signal.triggered and not signal.processed
    env.timeout(1.0).callbacks.append(lambda ev: order.append(("timeout", None, env.now)))
    env.run()
    assert order == [("timeout", None, 2.0), ("waiter", "wake", 2.0)]
    try:
        succeed_at(env, signal, 3.0)
    except RuntimeError:
        pass
    else:
        raise AssertionError("a triggered event succeeded twice")


def test_move_wait_resumes_the_process_at_the_new_event():
    """A process waiting on a far event resumes at the new one, with its value; the old
    event still fires, with nobody waiting."""
    env = simpy.Environment()
    log = []

    def sleeper():
        value = yield far
        log.append((env.now, value))
        yield env.timeout(100)

    far = env.timeout(10, "far")
    proc = env.process(sleeper())
    env.run(until=1)
    near = timer_at(env, 2.5)
    move_wait(proc, near)
    assert proc.target is near
    env.run(until=50)
    assert log == [(2.5, None)]
    assert far.processed and far.value == "far"  # fired, and the process did not resume twice
    assert proc.is_alive and proc.target is not far


def test_events_scheduled_counts_and_uses_an_id():
    """events_scheduled is the number of events scheduled so far (born-processed puts and
    processes' waits included only as scheduled); each reading uses one id."""
    env = simpy.Environment()
    assert events_scheduled(env) == 0
    env.timeout(1)
    ProcessedEvent(env, None)  # not scheduled
    timer_at(env, 2.0)
    assert events_scheduled(env) == 3  # 1 read + 1 timeout + 1 timer
    assert events_scheduled(env) == 4


def test_environment_methods_delegate_to_the_functions():
    """The kernel Environment is a simpy.Environment whose timer_at, schedule_at,
    succeed_at and events_scheduled do what the functions do."""
    env = Environment()
    assert isinstance(env, simpy.Environment)
    got = []

    def proc():
        yield env.timer_at(0.1 + 0.2)
        got.append(env.now)
        signal = env.event()
        env.succeed_at(signal, 5.2, "s")
        got.append((yield signal))
        got.append(env.now)

    env.process(proc())
    env.run()
    assert got == [0.1 + 0.2, "s", 5.2]
    assert env.events_scheduled() == 4  # the process's start, the timer, the signal, its end
    ev = env.event()
    ev.callbacks.append(lambda e: got.append(env.now))
    ev._ok, ev._value = True, None  # triggered, not scheduled (the test's own shortcut)
    env.schedule_at(ev, 7.0)
    env.run()
    assert got[-1] == 7.0


def test_processed_event_is_processed_ok_with_its_value():
    """A ProcessedEvent is triggered, processed and ok with its value; yielding it continues
    at once, in the same instant, without scheduling anything."""
    env = simpy.Environment()
    ev = ProcessedEvent(env, {"k": 1})
    assert (ev.triggered, ev.processed, ev.ok, ev.value) == (True, True, True, {"k": 1})
    got = []

    def proc():
        got.append((yield ev))
        got.append(env.now)

    env.process(proc())
    env.run()
    assert got == [{"k": 1}, 0]
    assert events_scheduled(env) == 2  # the process's start and end only


def test_channel_serves_gets_through_its_public_hooks():
    """A Channel subclass made of serve() and serve_getters() alone serves a waiting getter
    when an item arrives, and a new getter at once when one is there; its put never queues."""

    class Box(Channel):
        get = BoundClass(Get)

        def __init__(self, env: simpy.Environment) -> None:
            super().__init__(env)
            self.things: list[str] = []

        def put(self, thing: str) -> ProcessedEvent:  # type: ignore[override]
            self.things.append(thing)
            if self.get_queue:
                self.serve_getters()
            return ProcessedEvent(self.env, thing)

        def serve(self, event: Get) -> bool:
            if not self.things:
                return False
            event.succeed(self.things.pop(0))
            return True

    env = simpy.Environment()
    box = Box(env)
    assert box.env is env and box.capacity == float("inf")
    first, second = box.get(), box.get()
    assert not first.triggered and len(box.get_queue) == 2
    assert box.put("a").processed
    assert first.value == "a" and not second.triggered
    box.put("b")
    box.put("c")
    assert second.value == "b" and box.get().value == "c" and not box.get_queue


def test_channel_without_serve_has_no_get_side():
    """A Channel that does not implement serve() refuses a get."""
    env = simpy.Environment()
    box = Channel(env)
    try:
        Get(box)
    except NotImplementedError as exc:
        assert "no get side" in str(exc)
    else:
        raise AssertionError("a get on a bare Channel was accepted")


def test_check_simpy_passes_on_the_installed_simpy():
    """The installed SimPy keeps the contract (the check runs at import too), and it is the
    checked minor release."""
    check_simpy()
    assert simpy.__version__.startswith(CHECKED_SIMPY + ".")


def _raises_contract_error(*names: str) -> str:
    try:
        check_simpy()
    except SimPyContractError as exc:
        message = str(exc)
    else:
        raise AssertionError("check_simpy() passed on a broken SimPy")
    assert isinstance(SimPyContractError("x"), RuntimeError)
    assert "simpy_llm.kernel" in message
    assert f"SimPy {simpy.__version__}" in message
    assert f"checked against SimPy {CHECKED_SIMPY}" in message
    for name in names:
        assert name in message, message
    return message


def test_check_simpy_names_a_missing_process_resume(monkeypatch):
    """A SimPy whose Process has no ``_resume`` fails the check with a SimPyContractError
    naming simpy_llm.kernel, the version found, the internal and the checked release."""
    monkeypatch.delattr(simpy.events.Process, "_resume")
    _raises_contract_error("Process._resume")


def test_check_simpy_names_an_environment_without_its_event_counter(monkeypatch):
    """A SimPy whose Environment keeps no ``_eid`` counter fails the check, naming it."""
    original = simpy.core.Environment.__init__

    def without_eid(self, *args, **kwargs):
        original(self, *args, **kwargs)
        del self._eid

    monkeypatch.setattr(simpy.core.Environment, "__init__", without_eid)
    _raises_contract_error("Environment._eid")


def test_check_simpy_names_a_resource_without_trigger_get(monkeypatch):
    """A SimPy whose BaseResource has no ``_trigger_get`` fails the check, naming it."""
    monkeypatch.delattr(simpy.resources.base.BaseResource, "_trigger_get")
    _raises_contract_error("BaseResource._trigger_get")


def test_check_simpy_names_a_wait_that_no_longer_moves(monkeypatch):
    """A SimPy whose processes keep their wait elsewhere than ``_target`` fails the
    check, naming it."""
    original = simpy.events.Process.__init__

    def elsewhere(self, env, generator):
        original(self, env, generator)
        self._waiting_for = self.__dict__.pop("_target")

    monkeypatch.setattr(simpy.events.Process, "__init__", elsewhere)
    monkeypatch.setattr(simpy.events.Process, "target", property(lambda self: self._waiting_for))
    _raises_contract_error("Process._target")


def test_the_kernel_module_names_its_rule():
    """The module's docstring states that it is the one place that touches SimPy internals."""
    assert "one module" in kernel.__doc__ and "SimPy" in kernel.__doc__


def test_the_kernel_environment_binds_simpy_event_factories_to_the_instance():
    """The kernel's Environment binds SimPy's event factories (timeout, event, process...) to
    the instance as a plain simpy.Environment does, so a call does not go through the class
    descriptor each time."""
    from simpy.core import BoundClass

    from simpy_llm.kernel import Environment

    plain, ours = simpy.Environment(), Environment()
    factories = [name for name, obj in vars(simpy.Environment).items() if type(obj) is BoundClass]
    assert {"timeout", "event", "process"} <= set(factories)
    for name in factories:
        assert name in vars(plain) and name in vars(ours), name


def test_stops_of_a_sliced_run_are_not_counted_as_events():
    """``events_scheduled`` of the kernel's Environment counts the model's events only: a model
    run to its end in one piece, in time slices, or until one of its own events reports the
    same count (SimPy schedules one or two events per stop)."""

    def counted(slices: list[float]) -> int:
        env = Environment()

        def ticker():
            for _ in range(10):
                yield env.timeout(1.0)

        proc = env.process(ticker())
        for until in slices:
            env.run(until=until)
        env.run(until=proc)
        return env.events_scheduled()

    assert counted([]) == counted([0.5, 2.5, 9.5]) == counted([3.0]) == 12  # start, 10 timeouts, end


def _trace_run(env: simpy.Environment) -> list:
    """A run exercising what SimPy's loop does: timeouts and processes at equal times, a
    failed event a process defuses, a run in slices by time and by event, a stop whose event
    has callbacks after the stopping one, and a failure nobody defuses (re-raised as a copy)."""
    log: list = []

    def worker(name, gaps):
        for gap in gaps:
            value = yield env.timeout(gap, value=(name, gap))
            log.append((env.now, "woke", value))

    def failing():
        yield env.timeout(1.5)
        raise KeyError("inner")

    def catcher(proc):
        try:
            yield proc
        except KeyError as exc:
            log.append((env.now, "defused", exc.args))

    for i in range(4):
        env.process(worker(f"w{i}", [0.5, 0.25 * i, 1.0, 0.0, 2.0]))
    env.process(catcher(env.process(failing())))
    marker = env.timeout(2.25, value="marker")
    marker.callbacks.append(lambda ev: log.append((env.now, "first", ev.value)))
    log.append(("until", env.run(until=1.0)))
    log.append(("until", env.run(until=marker)))
    log.append(("until", env.run(until=marker)))
    late = env.timeout(0.5)
    late.callbacks.append(lambda ev: log.append((env.now, "before stop")))

    def waiter():  # hangs on *late* once the run started: after the stop's callback
        yield late
        log.append((env.now, "after stop"))

    env.process(waiter())
    log.append(("until", env.run(until=late)))

    def crash():
        yield env.timeout(0.1)
        raise ValueError("outer", 7)

    env.process(crash())
    try:
        env.run()
    except ValueError as exc:
        log.append((env.now, "crashed", exc.args, type(exc.__cause__).__name__))
    env.run()
    log.append((env.now, "end", events_scheduled(env)))
    return log


def test_the_kernel_event_loop_runs_as_simpy_runs():
    """Environment.run's own loop (SimPy's step inline) gives the same callbacks in the same
    order at the same times, the same return values, errors and event ids as SimPy's."""
    assert _trace_run(Environment()) == _trace_run(simpy.Environment())


def test_an_environment_with_its_own_step_keeps_simpy_loop():
    """A subclass overriding step (as a real-time environment does) has it called per event."""
    calls = []

    class Counting(Environment):
        def step(self):
            calls.append(self.now)
            super().step()

    env = Counting()
    env.timeout(1.0)
    env.timeout(2.0)
    env.run()
    assert calls == [0, 1.0, 2.0]  # two events, then the call that finds none left


def test_a_step_set_on_the_instance_is_called_per_event():
    """A step assigned on one environment (an event budget in a test, a profiler's hook) has it
    called per event, as SimPy's own loop would, and can stop the run."""
    env = Environment()
    step = env.step
    calls = []

    def counted() -> None:
        calls.append(env.now)
        if len(calls) > 2:
            raise RuntimeError("budget spent")
        step()

    env.step = counted  # type: ignore[method-assign]
    for delay in (1.0, 2.0, 3.0, 4.0):
        env.timeout(delay)
    with pytest.raises(RuntimeError, match="budget spent"):
        env.run()
    assert calls == [0, 1.0, 2.0]
