"""Profile a real drafter/verifier pair: llama.cpp's n-gram drafter against Gemma 3 270M, into the
profiling log acceptance models are trained on (seed 003 §5.4, "Acceptance Profiling Pipeline",
step 1).

:func:`profile_llamacpp_speculation` starts the llama.cpp server (the ``real-server`` extra) with
speculative decoding by one of its n-gram drafters and its debug log on, sends designed prompts
one at a time, and reads the server's own account of every verify step from its log
(:mod:`simpy_llm.speculative.server_logs`). It checks that account twice over, independently:

* each request's steps add up to the draft tally the server logs when the request ends;
* that tally equals the ``draft_n`` / ``draft_n_accepted`` of the response's ``timings``.

It writes into *out*:

* ``steps.csv``: one row per verify step (``task``, ``context_len``, ``temperature``, ``k``,
  ``accepted_count``), the per-step log ``train_acceptance --per-step`` reads;
* ``profiling_log.csv``: the per-token rows (:mod:`~simpy_llm.speculative.profiling_log`), with
  ``drafter`` and ``verifier`` columns;
* ``requests.csv``: each request's prompt length and the response's timings;
* ``spec_lines.log``: the server log's step and tally lines (the rest of the debug log, about a
  thousand lines per request, is not kept);
* ``profile.json``: the run's settings and totals.

The prompts repeat a short cycle of random sentences a random number of times (seeded): an
n-gram drafter drafts from what the context already holds, so repetition is what it needs to
draft at all, and the varied cycles give varied contexts and acceptance. Drafted lengths vary from step to
step (as long as the n-gram match allows, up to the drafter's maximum): this is not the fixed
``k`` the profiling-log docs advise, but the draft length depends on the context, not on the
request's past acceptance, so deep positions are not biased towards easy requests.

Command line::

    python -m simpy_llm.observe.spec_profile --out DIR [--requests 12] [--n-predict 96]
        [--temperature 0] [--speculative ngram-simple] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from simpy_llm.observe.llamacpp import SPECULATIVE_TYPES, LlamaCppConfig, LlamaCppServer
from simpy_llm.speculative.profiling_log import profiling_rows_from_steps
from simpy_llm.speculative.server_logs import (
    SPEC_LINE_MARKS,
    check_steps_against_totals,
    llamacpp_spec_steps,
    llamacpp_spec_totals,
)

__all__ = ["SpecProfile", "main", "profile_llamacpp_speculation", "profiling_prompts"]

_ADJECTIVES = "red blue green quiet loud early late small large warm cold old young bright dark".split()
_NOUNS = "bird river stone cloud garden window ship tree house road hill storm letter lamp field".split()
_VERBS = "sat stood slept waited rested fell".split()
_PLACES = "on near under behind beside over".split()


def _sentence(rng: random.Random) -> str:
    return (f"The {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)} {rng.choice(_VERBS)} {rng.choice(_PLACES)} "
            f"the {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}.")


def _vary(sentence: str, rng: random.Random, share: float) -> str:
    """*sentence* with each adjective or noun swapped for another with probability *share*."""
    words = sentence[:-1].split()
    for i, w in enumerate(words):
        pool = _ADJECTIVES if w in _ADJECTIVES else _NOUNS if w in _NOUNS else None
        if pool is not None and rng.random() < share:
            words[i] = rng.choice(pool)
    return " ".join(words) + "."


def profiling_prompts(n: int, seed: int = 0) -> list[str]:
    """*n* prompts, each a cycle of 1-3 random sentences ("The red bird sat on the old stone
    wall.") repeated 2-12 times, each repeat with each adjective and noun swapped with a
    probability drawn per prompt from 0-0.5; drawn by a generator seeded with *seed*. A base
    model continues such text by repeating it, which an n-gram drafter can draft, and the swaps
    make it depart from the drafts at varied rates.

    >>> p = profiling_prompts(2, seed=1)
    >>> len(p), p == profiling_prompts(2, seed=1), p[0].startswith("The ")
    (2, True, True)
    """
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        cycle = [_sentence(rng) for _ in range(rng.randint(1, 3))]
        share = rng.uniform(0.0, 0.5)
        prompts.append(" ".join(_vary(x, rng, share) for _ in range(rng.randint(2, 12)) for x in cycle))
    return prompts


@attrs.frozen(kw_only=True)
class SpecProfile:
    """What :func:`profile_llamacpp_speculation` measured (also written to its directory)."""

    out: Path
    """The directory written."""
    steps: Any
    """The per-step table (``steps.csv``), a DataFrame."""
    rows: Any
    """The per-token profiling log (``profiling_log.csv``), a DataFrame."""
    requests: Any
    """Per-request prompt tokens and timings (``requests.csv``), a DataFrame."""


def _complete(url: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """POST ``/completion`` directly (loopback: no proxy); the decoded JSON."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with opener.open(request, timeout=timeout_s) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def profile_llamacpp_speculation(
    out: Path | str,
    *,
    requests: int = 12,
    n_predict: int = 96,
    temperature: float = 0.0,
    speculative: str = "ngram-simple",
    seed: int = 0,
    timeout_s: float = 300.0,
) -> SpecProfile:
    """Profile llama.cpp's *speculative* n-gram drafter on *requests* prompts of
    :func:`profiling_prompts` (module docstring), each generating *n_predict* tokens at
    *temperature* (sampling seeded by *seed* and the request's index); writes *out*.

    Raises
    ------
    ValueError
        The server's accounts disagree (module docstring), or a setting is out of range.
    LlamaCppServerError
        The server did not start.
    """
    import pandas as pd

    if speculative not in SPECULATIVE_TYPES:
        raise ValueError(f"speculative must be one of {', '.join(SPECULATIVE_TYPES)}, got {speculative!r}")
    if requests < 1 or n_predict < 1 or not temperature >= 0:
        raise ValueError(f"requests and n_predict must be >= 1 and temperature >= 0, got {requests}, {n_predict}, {temperature}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = LlamaCppConfig(port=0, parallel=1, threads=1, cache_prompt=False, speculative=speculative, debug_log=True)
    log_path = out / "server.log"
    answers = []
    prompts = profiling_prompts(requests, seed)
    with LlamaCppServer(config, log_path=log_path) as server:
        assert server.url is not None  # set by start()
        for i, prompt in enumerate(prompts):
            body = {"prompt": prompt, "n_predict": n_predict, "temperature": temperature, "seed": seed * 100_003 + i,
                    "cache_prompt": False, "ignore_eos": True}
            answers.append(_complete(server.url, body, timeout_s))
    text = log_path.read_text(encoding="utf-8", errors="replace")
    try:
        steps = llamacpp_spec_steps(text)
        totals = llamacpp_spec_totals(text)
        check_steps_against_totals(steps, totals)
        tallies = totals.sort_values("task")[["accepted", "generated"]].to_numpy().tolist()
        timed = [[int(a["timings"].get("draft_n_accepted", 0)), int(a["timings"].get("draft_n", 0))] for a in answers]
        timed = [t for t in timed if t[1]]  # a request that drafted nothing logs no tally
        if tallies != timed:
            raise ValueError(f"the server log's draft tallies {tallies} differ from the responses' timings {timed}")
    except ValueError as exc:
        raise ValueError(f"{exc} (the server's log is kept: {log_path})") from None
    log_path.unlink()
    kept = [line for line in text.splitlines() if any(mark in line for mark in SPEC_LINE_MARKS)]
    (out / "spec_lines.log").write_text("\n".join(kept) + "\n", encoding="utf-8")
    steps = steps.assign(temperature=float(temperature))[["task", "context_len", "temperature", "k", "accepted_count"]]
    steps.to_csv(out / "steps.csv", index=False)
    rows = profiling_rows_from_steps(steps.drop(columns=["task"])).assign(drafter=speculative, verifier=config.alias)
    rows.to_csv(out / "profiling_log.csv", index=False)
    table = pd.DataFrame([
        {"request": i, "prompt_tokens": a["timings"]["prompt_n"], "predicted_tokens": a["timings"]["predicted_n"],
         "draft_n": a["timings"].get("draft_n", 0), "draft_n_accepted": a["timings"].get("draft_n_accepted", 0),
         "predicted_ms": a["timings"]["predicted_ms"]}
        for i, a in enumerate(answers)
    ])
    table.to_csv(out / "requests.csv", index=False)
    summary = {
        "drafter": speculative, "verifier": config.alias, "server": config.server_block(), "requests": requests,
        "n_predict": n_predict, "temperature": temperature, "seed": seed, "steps": len(steps),
        "drafted_tokens": int(steps["k"].sum()), "accepted_tokens": int(steps["accepted_count"].sum()),
        "profiling_rows": len(rows),
    }
    (out / "profile.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return SpecProfile(out=out, steps=steps, rows=rows, requests=table)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m simpy_llm.observe.spec_profile --out DIR ...`` (module docstring); exit status
    0, or 1 when the profile could not be made (the reason printed)."""
    from simpy_llm.observe.llamacpp import LlamaCppServerError

    p = argparse.ArgumentParser(prog="python -m simpy_llm.observe.spec_profile", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory to write (module docstring lists the files)")
    p.add_argument("--requests", type=int, default=12, help="prompts sent, one at a time (default 12)")
    p.add_argument("--n-predict", type=int, default=96, help="tokens generated per request (default 96)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    p.add_argument("--speculative", choices=sorted(SPECULATIVE_TYPES), default="ngram-simple", help="the n-gram drafter")
    p.add_argument("--seed", type=int, default=0, help="seeds the prompts and the sampling (default 0)")
    args = p.parse_args(argv)
    try:
        made = profile_llamacpp_speculation(
            args.out, requests=args.requests, n_predict=args.n_predict, temperature=args.temperature,
            speculative=args.speculative, seed=args.seed,
        )
    except (ValueError, OSError, LlamaCppServerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    k, m = int(made.steps["k"].sum()), int(made.steps["accepted_count"].sum())
    print(f"{len(made.steps)} verify steps, {m} of {k} drafted tokens accepted; {len(made.rows)} profiling rows in {made.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
