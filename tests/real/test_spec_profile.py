"""Profiling a real drafter/verifier pair: llama.cpp's n-gram drafter against Gemma 3 270M
(``simpy_llm.observe.spec_profile``). The server's step lines, its per-request tallies and the
responses' timings are three accounts of the same drafts; the profile holds only when they agree."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from simpy_llm.observe.spec_profile import profile_llamacpp_speculation
from simpy_llm.speculative.profiling_log import check_profiling_log

pytestmark = pytest.mark.real_server


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory):
    """Four requests of 48 tokens at temperature 1, the n-gram drafter on (its own server)."""
    return profile_llamacpp_speculation(tmp_path_factory.mktemp("ngram"), requests=4, n_predict=48, temperature=1.0, seed=3)


def test_the_steps_add_up_to_what_the_responses_report(profile) -> None:
    """Every drafted and accepted token in the step rows is one the responses' timings count."""
    assert int(profile.steps["k"].sum()) == int(profile.requests["draft_n"].sum()) > 0
    assert int(profile.steps["accepted_count"].sum()) == int(profile.requests["draft_n_accepted"].sum())


def test_the_profiling_log_is_valid_and_written(profile) -> None:
    """The per-token rows pass the profiling log's checks (chain order included) for this pair,
    and the files named in the module docstring are written."""
    check_profiling_log(profile.rows, drafter="ngram-simple", verifier="gemma-3-270m-q4_k_m")
    out: Path = profile.out
    for name in ("steps.csv", "profiling_log.csv", "requests.csv", "spec_lines.log", "profile.json"):
        assert (out / name).is_file(), name
    assert not (out / "server.log").exists()
    assert len(pd.read_csv(out / "profiling_log.csv")) == len(profile.rows)
