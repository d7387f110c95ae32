"""Speculative steps read from a real server's log: llama.cpp's (seed 003 §5.4, "Profiler
emission"), the raw material of a profiling log for a real drafter/verifier pair.

llama.cpp's server, run with speculative decoding and at its debug log level
(:class:`~simpy_llm.observe.llamacpp.LlamaCppConfig` ``speculative``, ``debug_log``), writes two
lines for each verify step of a slot: when it drafts, and when the target has verified::

    ... D slot handle_last_: id  0 | task 3 | generate_draft: id=580, #tokens=62, #draft=22, pos_next=62
    ... D slot   operator(): id  0 | task 3 | add accepted tokens: sampled=669, ids.size=4, n_draft=22

(the sequence held ``#tokens = 62`` tokens when ``K = 22`` tokens were drafted after it, and
verification kept ``ids.size - 1 = 3`` of them, plus the token the target sampled next). It also
writes ``accepted 3/22 draft tokens, new n_tokens = 66``, but not for the step that ends a
request, so that line is not read. A finished request's tally follows::

    ... I slot print_timing: id  0 | task 3 | draft acceptance = 0.13636 (    3 accepted /    22 generated), ...

:func:`llamacpp_spec_steps` reads the step lines into per-step rows, :func:`llamacpp_spec_totals`
the tallies into per-request totals, which the steps must add up to
(:func:`check_steps_against_totals`: an independent count of the same run, as the server tallies
them apart from the step lines). A step's ``context_len`` is the sequence before it, ``#tokens``.
Steps with no draft (no n-gram matched) are not speculative steps and write neither line.

Examples
--------
>>> text = '''0.23.043.335 D slot handle_last_: id  0 | task 166 | generate_draft: id=580, #tokens=62, #draft=22, pos_next=62
... 0.23.744.798 D slot   operator(): id  0 | task 166 | add accepted tokens: sampled=669, ids.size=4, n_draft=22
... 0.23.744.985 D slot   operator(): id  0 | task 166 | accepted 3/22 draft tokens, new n_tokens = 66
... 0.25.303.033 I slot print_timing: id  0 | task 166 | draft acceptance = 0.13636 (    3 accepted /    22 generated), mean len =  4.00'''
>>> llamacpp_spec_steps(text).to_dict("records")
[{'slot': 0, 'task': 166, 'context_len': 62, 'k': 22, 'accepted_count': 3}]
>>> llamacpp_spec_totals(text).to_dict("records")
[{'slot': 0, 'task': 166, 'accepted': 3, 'generated': 22}]
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SPEC_LINE_MARKS", "STEP_COLUMNS", "check_steps_against_totals", "llamacpp_spec_steps", "llamacpp_spec_totals"]

SPEC_LINE_MARKS = ("generate_draft:", "add accepted tokens:", "draft tokens, new n_tokens", "draft acceptance =")
"""Text that marks the log lines this module reads (and the ``accepted M/K`` line): a profile
keeps these lines of the server's debug log and nothing else."""
STEP_COLUMNS = ("slot", "task", "context_len", "k", "accepted_count")
"""The columns of :func:`llamacpp_spec_steps`; ``context_len``, ``k`` and ``accepted_count`` are
those :func:`~simpy_llm.speculative.profiling_log.profiling_rows_from_steps` reads."""

_DRAFT = re.compile(r"id\s+(?P<slot>\d+) \| task (?P<task>\d+) \| generate_draft: .*#tokens=(?P<n>\d+), #draft=(?P<k>\d+)")
_VERIFIED = re.compile(r"id\s+(?P<slot>\d+) \| task (?P<task>\d+) \| add accepted tokens: .*ids\.size=(?P<s>\d+), n_draft=(?P<k>\d+)")
_TOTAL = re.compile(
    r"id\s+(?P<slot>\d+) \| task (?P<task>\d+) \| draft acceptance = [0-9.eE+-]+ \(\s*(?P<a>\d+) accepted /\s*(?P<g>\d+) generated\)"
)


def llamacpp_spec_steps(text: str) -> pd.DataFrame:
    """One row per verify step in a llama.cpp server log (module docstring), in log order.

    Raises :class:`ValueError` naming the line: a verification with no draft before it on its
    slot and task, one whose draft length differs from the draft's, or one keeping more drafts
    than were made.
    """
    import pandas as pd

    rows = []
    drafted: dict[tuple[int, int], tuple[int, int]] = {}
    for line_no, line in enumerate(text.splitlines(), 1):
        found = _DRAFT.search(line)
        if found is not None:
            drafted[(int(found["slot"]), int(found["task"]))] = (int(found["n"]), int(found["k"]))
            continue
        found = _VERIFIED.search(line)
        if found is None:
            continue
        key = (int(found["slot"]), int(found["task"]))
        draft = drafted.pop(key, None)
        k, m = int(found["k"]), int(found["s"]) - 1
        if draft is None or draft[1] != k or not 0 <= m <= k:
            raise ValueError(f"line {line_no}: a verification of {k} drafts keeping {m} does not follow a draft of "
                             f"{k} tokens on slot {key[0]}, task {key[1]}: {line.strip()!r}")
        rows.append((key[0], key[1], draft[0], k, m))
    return pd.DataFrame(rows, columns=list(STEP_COLUMNS))


def llamacpp_spec_totals(text: str) -> pd.DataFrame:
    """One row per finished request in a llama.cpp server log: its ``slot``, ``task`` and the
    server's own tally of drafted tokens ``generated`` and ``accepted`` (module docstring)."""
    import pandas as pd

    rows = [(int(f["slot"]), int(f["task"]), int(f["a"]), int(f["g"])) for f in map(_TOTAL.search, text.splitlines()) if f]
    return pd.DataFrame(rows, columns=["slot", "task", "accepted", "generated"])


def check_steps_against_totals(steps: pd.DataFrame, totals: pd.DataFrame) -> None:
    """Raise :class:`ValueError` unless each request's steps add up to the server's totals
    (drafted tokens ``k``, accepted ``accepted_count``) and every step belongs to a finished request.

    >>> import pandas as pd
    >>> steps = pd.DataFrame({"slot": [0, 0], "task": [1, 1], "context_len": [9, 12], "k": [4, 4], "accepted_count": [2, 0]})
    >>> check_steps_against_totals(steps, pd.DataFrame({"slot": [0], "task": [1], "accepted": [2], "generated": [8]}))
    >>> check_steps_against_totals(steps, pd.DataFrame({"slot": [0], "task": [1], "accepted": [3], "generated": [8]}))
    Traceback (most recent call last):
    ...
    ValueError: task 1 (slot 0): its step lines add up to 2 accepted of 8 drafted, the server's tally says 3 of 8
    """
    sums = steps.groupby(["slot", "task"])[["accepted_count", "k"]].sum()
    tallies = {(int(r.slot), int(r.task)): (int(r.accepted), int(r.generated)) for r in totals.itertuples(index=False)}
    for (slot, task), row in sums.iterrows():
        mine = (int(row["accepted_count"]), int(row["k"]))
        theirs = tallies.get((int(slot), int(task)))
        if theirs is None:
            raise ValueError(f"task {task} (slot {slot}) has step lines but no draft tally: the log was cut before it finished")
        if mine != theirs:
            raise ValueError(
                f"task {task} (slot {slot}): its step lines add up to {mine[0]} accepted of {mine[1]} drafted, "
                f"the server's tally says {theirs[0]} of {theirs[1]}"
            )
    for (slot, task), (_, generated) in tallies.items():
        if generated and (slot, task) not in sums.index:
            raise ValueError(f"task {task} (slot {slot}) drafted {generated} tokens but no step line shows them: "
                             "was the server's debug log on?")
