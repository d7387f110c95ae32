"""simpy_llm.explore.pareto: dominance, the front, ties, NaN, errors, and hypothesis
properties (no front row is dominated, every dropped row is, order does not matter)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm.explore.pareto import dominated, pareto_front

OBJ = {"goodput": "max", "p99": "min"}


def beats(a: np.ndarray, b: np.ndarray) -> bool:
    """a dominates b (both in larger-is-better form)."""
    return bool((a >= b).all() and (a > b).any())


def test_front_of_a_hand_built_frame():
    """The front keeps the non-dominated rows in their order with their index."""
    frame = pd.DataFrame(
        {"goodput": [10.0, 12.0, 9.0, 11.0, 12.0], "p99": [1.0, 2.0, 1.5, 1.0, 3.0], "policy": list("abcde")},
        index=[10, 20, 30, 40, 50],
    )
    front = pareto_front(frame, OBJ)
    assert front.index.tolist() == [20, 40]  # a loses to d (more goodput, same p99); c, e lose too
    assert front["policy"].tolist() == ["b", "d"]
    assert dominated(frame, OBJ).tolist() == [True, False, True, False, True]


def test_equal_points_are_both_kept():
    """Two rows equal on every objective do not dominate each other."""
    frame = pd.DataFrame({"goodput": [5.0, 5.0, 4.0], "p99": [1.0, 1.0, 1.0]})
    assert pareto_front(frame, OBJ).index.tolist() == [0, 1]


def test_rows_with_nan_are_left_out():
    """A row with NaN in an objective is marked dominated and dominates nothing."""
    frame = pd.DataFrame({"goodput": [np.nan, 5.0], "p99": [0.1, 1.0]})
    assert dominated(frame, OBJ).tolist() == [True, False]


def test_one_objective_front_is_the_best_rows():
    """With one objective the front is every row attaining its best value."""
    frame = pd.DataFrame({"cost": [3.0, 1.0, 2.0, 1.0]})
    assert pareto_front(frame, {"cost": "min"}).index.tolist() == [1, 3]


@pytest.mark.parametrize(
    ("objectives", "error", "match"),
    [
        ({}, ValueError, "non-empty"),
        ({"nope": "max"}, ValueError, "not in the frame; its columns: goodput, p99, name"),
        ({"goodput": "up"}, ValueError, "'max' or 'min'"),
        ({"name": "max"}, ValueError, "must hold numbers"),
    ],
)
def test_bad_objectives_are_rejected(objectives, error, match):
    """Unknown columns, directions and non-numeric columns raise errors naming them."""
    frame = pd.DataFrame({"goodput": [1.0], "p99": [1.0], "name": ["x"]})
    with pytest.raises(error, match=match):
        dominated(frame, objectives)


def test_frame_must_be_a_dataframe():
    """A frame that is not a DataFrame is a TypeError."""
    with pytest.raises(TypeError, match="DataFrame"):
        pareto_front([[1, 2]], OBJ)


values = st.integers(min_value=0, max_value=4).map(float)  # small range: many ties
frames = st.integers(min_value=1, max_value=25).flatmap(
    lambda n: st.tuples(st.lists(values, min_size=n, max_size=n), st.lists(values, min_size=n, max_size=n),
                        st.lists(values, min_size=n, max_size=n))
).map(lambda cols: pd.DataFrame({"a": cols[0], "b": cols[1], "c": cols[2]}))
OBJ3 = {"a": "max", "b": "min", "c": "max"}


def scored(frame: pd.DataFrame) -> np.ndarray:
    return np.column_stack([frame["a"], -frame["b"], frame["c"]])


@settings(max_examples=150, deadline=None)
@given(frames)
def test_no_front_row_is_dominated(frame):
    """No row of the front is dominated by any row of the frame."""
    s = scored(frame)
    front = pareto_front(frame, OBJ3)
    for i in front.index:
        assert not any(beats(s[j], s[i]) for j in range(len(frame)))


@settings(max_examples=150, deadline=None)
@given(frames)
def test_every_dropped_row_is_dominated_by_a_front_row(frame):
    """Every row left out of the front is dominated by some row of the front."""
    s = scored(frame)
    front = set(pareto_front(frame, OBJ3).index)
    assert front  # a non-empty frame has a non-empty front
    for i in set(frame.index) - front:
        assert any(beats(s[j], s[i]) for j in front)


@settings(max_examples=100, deadline=None)
@given(frames, st.randoms(use_true_random=False))
def test_front_is_invariant_to_row_order(frame, rnd):
    """Shuffling the rows gives the same front (by index)."""
    order = list(frame.index)
    rnd.shuffle(order)
    assert set(pareto_front(frame.loc[order], OBJ3).index) == set(pareto_front(frame, OBJ3).index)
