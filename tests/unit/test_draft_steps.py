"""The draft steps of a batching device (:class:`~simpy_llm.speculative.draft_batching.DraftSteps`)
on a bare SimPy environment, against counts made by hand."""

from __future__ import annotations

import types

import pytest
import simpy

from simpy_llm.speculative.draft_batching import DraftSteps


def linear(a: float, b: float):
    """A step time ``a + b n`` whatever the drafter."""
    return lambda drafter, n, now: a + b * n


def test_always_ready_rounds_fill_every_step():
    """Seven rounds of one token each, every one ready again the instant it is done, on
    steps of at most three: every step holds three, so K steps take ``K (a + 3 b)`` and
    draft ``3 K`` tokens (B / (a + b B) tokens per second)."""
    env = simpy.Environment()
    a, b, batch, steps_run = 0.004, 0.001, 3, 50
    drafter = types.SimpleNamespace(name="d")
    drafted: list[float] = []

    def done(req, spec):
        drafted.append(env.now)
        engine.add(req, spec, 1)

    engine = DraftSteps(env, batch, 0.0, step_s=linear(a, b), back_at=None, done=done)
    for i in range(7):
        engine.add(i, types.SimpleNamespace(drafter=drafter), 1)
    step = a + b * batch
    env.run(until=steps_run * step + step / 2)
    assert len(drafted) == batch * steps_run
    assert drafted[-1] == pytest.approx(steps_run * step, rel=1e-12)


def test_drafters_take_turns():
    """Rounds of two drafters ready together, two tokens each: the steps alternate between
    the drafters (the one ready longest first), so drafter x's rounds are done at the end of
    the third step and y's at the end of the fourth."""
    env = simpy.Environment()
    x, y = types.SimpleNamespace(name="x"), types.SimpleNamespace(name="y")
    done: list[tuple[str, float]] = []
    engine = DraftSteps(env, 4, 0.0, step_s=linear(0.01, 0.0), back_at=None,
                        done=lambda req, spec: done.append((req, round(env.now, 12))))
    engine.add("x1", types.SimpleNamespace(drafter=x), 2)
    engine.add("y1", types.SimpleNamespace(drafter=y), 2)
    engine.add("x2", types.SimpleNamespace(drafter=x), 2)
    env.run()
    assert done == [("x1", 0.03), ("x2", 0.03), ("y1", 0.04)]


def test_a_batch_waits_for_company_until_full_or_timed_out():
    """On an idle device the first round opens a batch: with room for two, a second round
    arriving 1 ms later fills it and the step starts then; a lone round starts after the
    full 5 ms wait."""
    env = simpy.Environment()
    d = types.SimpleNamespace(name="d")
    starts: list[tuple[int, float]] = []

    def step_s(drafter, n, now):
        starts.append((n, round(now, 12)))
        return 0.002

    engine = DraftSteps(env, 2, 0.005, step_s=step_s, back_at=None, done=lambda req, spec: None)
    engine.add("a", types.SimpleNamespace(drafter=d), 1)
    env.timeout(0.001).callbacks.append(lambda _: engine.add("b", types.SimpleNamespace(drafter=d), 1))
    env.timeout(0.010).callbacks.append(lambda _: engine.add("c", types.SimpleNamespace(drafter=d), 1))
    env.run()
    assert starts == [(2, 0.001), (1, 0.015)]


def test_a_step_due_out_of_service_starts_when_the_device_is_back():
    """A batch due at 0 while the device is out of service until 0.5 s starts its step at 0.5 s."""
    env = simpy.Environment()
    d = types.SimpleNamespace(name="d")
    done: list[float] = []
    engine = DraftSteps(env, 2, 0.0, step_s=linear(0.01, 0.0), back_at=lambda t: max(t, 0.5),
                        done=lambda req, spec: done.append(round(env.now, 12)))
    engine.add("a", types.SimpleNamespace(drafter=d), 1)
    env.run()
    assert done == [0.51]
