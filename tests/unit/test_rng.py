"""Named, reproducible random streams."""

from __future__ import annotations

import numpy as np
import pytest

from simpy_llm.rng import RandomStreams


def test_same_seed_and_name_give_the_same_numbers() -> None:
    """Two RandomStreams with one seed produce identical draws for the same stream name."""
    a = RandomStreams(42).stream("workload/chat").random(1000)
    b = RandomStreams(42).stream("workload/chat").random(1000)
    np.testing.assert_array_equal(a, b)


def test_stream_is_created_once_and_reused() -> None:
    """Asking twice for a name returns the same Generator (draws continue, not restart)."""
    streams = RandomStreams(1)
    g = streams.stream("router")
    assert streams.stream("router") is g
    first = g.random()
    assert streams.stream("router").random() != first


def test_different_names_give_different_numbers() -> None:
    """Streams with different names under one seed are not copies of each other."""
    streams = RandomStreams(7)
    a = streams.stream("a").random(1000)
    b = streams.stream("b").random(1000)
    assert not np.array_equal(a, b)


def test_different_seeds_give_different_numbers() -> None:
    """The same name under different root seeds gives different draws."""
    a = RandomStreams(1).stream("x").random(1000)
    b = RandomStreams(2).stream("x").random(1000)
    assert not np.array_equal(a, b)


def test_stream_does_not_depend_on_request_order() -> None:
    """A stream's numbers are the same whether it is requested first, last or alone."""
    names = ["workload/chat", "workload/batch", "router", "lengths"]
    alone = RandomStreams(11).stream("router").random(500)
    forward = RandomStreams(11)
    backward = RandomStreams(11)
    fwd = {n: forward.stream(n).random(500) for n in names}
    bwd = {n: backward.stream(n).random(500) for n in reversed(names)}
    for n in names:
        np.testing.assert_array_equal(fwd[n], bwd[n])
    np.testing.assert_array_equal(fwd["router"], alone)


def test_drawing_from_one_stream_does_not_shift_another() -> None:
    """Consuming many numbers from one stream leaves another stream's sequence unchanged."""
    quiet = RandomStreams(5)
    busy = RandomStreams(5)
    busy.stream("noisy").random(100_000)
    np.testing.assert_array_equal(quiet.stream("target").random(100), busy.stream("target").random(100))


def test_streams_are_statistically_uncorrelated() -> None:
    """Draws of two named streams are uncorrelated (|r| within 5 standard errors of 0)."""
    streams = RandomStreams(3)
    n = 100_000
    a = streams.stream("alpha").standard_normal(n)
    b = streams.stream("beta").standard_normal(n)
    r = float(np.corrcoef(a, b)[0, 1])
    assert abs(r) < 5 / np.sqrt(n)


def test_large_seed_is_accepted() -> None:
    """Any non-negative integer seed works (SeedSequence takes arbitrary size)."""
    a = RandomStreams(2**100).stream("x").random(10)
    b = RandomStreams(2**100).stream("x").random(10)
    np.testing.assert_array_equal(a, b)


def test_negative_seed_is_rejected() -> None:
    """A negative root seed raises ValueError."""
    with pytest.raises(ValueError, match="seed must be >= 0"):
        RandomStreams(-1)


def test_streams_are_numpy_generators() -> None:
    """Each stream is a numpy Generator (so samplers can use its full API)."""
    assert isinstance(RandomStreams(0).stream("s"), np.random.Generator)
