"""Speculative steps read from llama.cpp's debug log (speculative/server_logs.py), on the
committed profiling run of its n-gram drafter (tests/data/speculative/llamacpp_ngram)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from simpy_llm.speculative.profiling_log import check_profiling_log, profiling_rows_from_steps
from simpy_llm.speculative.server_logs import check_steps_against_totals, llamacpp_spec_steps, llamacpp_spec_totals

RUN = Path(__file__).resolve().parents[1] / "data" / "speculative" / "llamacpp_ngram"


@pytest.fixture(scope="module")
def log_text() -> str:
    return (RUN / "spec_lines.log").read_text(encoding="utf-8")


def test_the_committed_log_gives_the_committed_steps(log_text) -> None:
    """Parsing the kept log lines again gives the run's step table exactly."""
    steps = llamacpp_spec_steps(log_text)
    committed = pd.read_csv(RUN / "steps.csv")
    assert steps[["task", "context_len", "k", "accepted_count"]].equals(committed[["task", "context_len", "k", "accepted_count"]])


def test_each_request_adds_up_to_its_own_tally_and_the_responses(log_text) -> None:
    """Each request's steps add up to the server's tally line, and the tallies to the responses'
    ``draft_n`` and ``draft_n_accepted`` (three accounts of the same drafts)."""
    steps, totals = llamacpp_spec_steps(log_text), llamacpp_spec_totals(log_text)
    check_steps_against_totals(steps, totals)
    requests = pd.read_csv(RUN / "requests.csv")
    drafted = requests[requests["draft_n"] > 0]
    assert totals["generated"].tolist() == drafted["draft_n"].tolist()
    assert totals["accepted"].tolist() == drafted["draft_n_accepted"].tolist()


def test_the_context_is_the_sequence_before_the_step(log_text) -> None:
    """Where the server also logs the sequence after a step (``accepted M/K ..., new n_tokens =
    N``), the step's context is ``N - M - 1``: the step appended M drafts and the target's token."""
    import re

    after = [tuple(map(int, m.groups())) for m in re.finditer(r"accepted (\d+)/(\d+) draft tokens, new n_tokens = (\d+)", log_text)]
    steps = llamacpp_spec_steps(log_text)
    by_step = {(int(r.accepted_count), int(r.k), int(r.context_len) + int(r.accepted_count) + 1) for r in steps.itertuples()}
    assert after and all(a in by_step for a in after)


def test_the_rows_are_a_valid_profiling_log(log_text) -> None:
    """The per-token rows of the run pass the profiling log's checks (no row after a rejection)
    and are the committed profiling log."""
    steps = pd.read_csv(RUN / "steps.csv")
    rows = profiling_rows_from_steps(steps.drop(columns=["task"]))
    check_profiling_log(rows)
    committed = pd.read_csv(RUN / "profiling_log.csv")
    assert rows[["context_len", "position", "accepted"]].equals(committed[["context_len", "position", "accepted"]])


def test_a_tally_the_steps_do_not_reach_is_refused() -> None:
    """A request whose step lines fall short of its tally (a cut log) is refused, naming it."""
    steps = pd.DataFrame({"slot": [0], "task": [7], "context_len": [50], "k": [4], "accepted_count": [1]})
    totals = pd.DataFrame({"slot": [0, 0], "task": [7, 9], "accepted": [1, 2], "generated": [4, 6]})
    with pytest.raises(ValueError, match=r"task 9 .* drafted 6 tokens but no step line shows them"):
        check_steps_against_totals(steps, totals)


def test_a_verification_without_its_draft_is_refused() -> None:
    """A verification line that follows no draft of its slot and task names its line."""
    text = "0.1 D slot   operator(): id  0 | task 3 | add accepted tokens: sampled=5, ids.size=2, n_draft=4"
    with pytest.raises(ValueError, match="line 1: a verification of 4 drafts keeping 1"):
        llamacpp_spec_steps(text)
