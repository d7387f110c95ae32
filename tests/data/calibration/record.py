"""Record the calibration traces in this folder against the llama.cpp server (about 45 minutes).

Run from the repository root, with the ``real-server`` extra installed, on a machine that
is otherwise idle (other work on the cores shows up in the server's step times)::

    python -m tests.data.calibration.record [--only open_loop|multi_turn] [--out DIR]

Each workload in ``workloads/`` is sent by the observer (as ``simpy-llm observe`` does)
to a fresh llama.cpp server (``LlamaCppServer``: 4 slots of 2,048 tokens, 1 thread) with
the server's own description in the trace header (``--server-type llamacpp``, the
launcher's settings as the server config), after three waves of four requests that load
every slot (not recorded), with 5 warm-up requests, and the server's Prometheus counters
scraped every second:

* ``llamacpp_open_loop/``: ``workloads/open_loop.yaml``, completions, prompt cache off;
* ``llamacpp_multi_turn/``: ``workloads/multi_turn.yaml``, chat, prompt cache on;
* ``llamacpp_short_prompts/``: ``workloads/short_prompts.yaml``, completions, prompt cache
  off, and ``llamacpp_held_out_chat/``: ``workloads/held_out_chat.yaml``, chat, prompt cache
  on (the held-out test of ``docs/calibration.md``, recorded with the probe, one after the
  other: ``--only held_out`` records the three);
* ``llamacpp_probe/``: ``simpy-llm calibrate probe`` of the same server, prompt cache and
  host-memory cache on (its trace and ``profile.yaml``, the priors of the fits in
  ``docs/calibration.md``). ``llamacpp_probe_runs/`` holds two more probes of the same
  server made the same way on the same day, ``earlier`` (37 minutes before) and ``long``
  (after, with ``run_probe(..., max_seconds=240)``);
* ``llamacpp_held_out_docs_set/``: a probe, ``short_prompts`` again and ``held_out_docs``
  (``workloads/held_out_docs.yaml``: single documents of 300-1,200 tokens, completions, prompt
  cache off), recorded one after the other on a later day (``--only held_out_docs_set``), and
  ``llamacpp_held_out_docs_half_load_set/`` the same with shorter documents (300-900 tokens)
  that keep the server about half busy (``--only held_out_docs_half_load_set``);
  ``llamacpp_held_out_docs_quiet_set/`` is the same recipe recorded again on an idle machine
  with a faster processor (``--only held_out_docs_quiet_set``), and
  ``llamacpp_held_out_docs_busy_set/`` the same documents four times as often, so that they queue
  (``workloads/held_out_docs_busy.yaml``, ``--only held_out_docs_busy_set``).

Then it fits a profile to the open-loop trace (``llamacpp_open_loop_profile.yaml``, as
``simpy-llm calibrate fit`` does). The tests read the committed files; they never record.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent

RUNS = {
    "open_loop": {"workload": "open_loop.yaml", "api": "completions", "cache_prompt": False},
    "multi_turn": {"workload": "multi_turn.yaml", "api": "chat", "cache_prompt": True},
    "short_prompts": {"workload": "short_prompts.yaml", "api": "completions", "cache_prompt": False},
    "held_out_chat": {"workload": "held_out_chat.yaml", "api": "chat", "cache_prompt": True},
    "held_out_docs": {"workload": "held_out_docs.yaml", "api": "completions", "cache_prompt": False},
    "held_out_docs_half_load": {"workload": "held_out_docs_half_load.yaml", "api": "completions", "cache_prompt": False},
    "held_out_docs_busy": {"workload": "held_out_docs_busy.yaml", "api": "completions", "cache_prompt": False},
}
FIRST_DAY = ("open_loop", "multi_turn", "short_prompts", "held_out_chat")
"""What a run without ``--only`` records (with the probe)."""

SETS = {
    "held_out": ["probe", "short_prompts", "held_out_chat"],
    "held_out_docs_set": ["probe", "short_prompts", "held_out_docs"],
    "held_out_docs_half_load_set": ["probe", "short_prompts", "held_out_docs_half_load"],
    "held_out_docs_quiet_set": ["probe", "short_prompts", "held_out_docs_half_load"],
    "held_out_docs_busy_set": ["probe", "short_prompts", "held_out_docs_busy"],
}
"""Recordings made one after the other, so that a probe and a fitting trace describe the server
as it ran the held-out workload; each later set is written to ``llamacpp_<set>/``."""

WARM_UP_REQUESTS = 5


def record(name: str, out: Path) -> Path:
    """Record workload *name* of :data:`RUNS` into ``out/llamacpp_<name>``; returns that directory."""
    from simpy_llm.observe.llamacpp import LlamaCppConfig, LlamaCppServer
    from simpy_llm.observe.run import observe

    run = RUNS[name]
    config = LlamaCppConfig(port=0, parallel=4, threads=1, cache_prompt=run["cache_prompt"])
    target = out / f"llamacpp_{name}"
    with LlamaCppServer(config) as server:
        _prewarm(server)
        summary = observe(
            # relative to the repository root, so the header names the spec without a machine path
            str((HERE / "workloads" / run["workload"]).relative_to(HERE.parents[2])),
            server.url,
            target,
            api=run["api"],
            server_type="llamacpp",
            server_config={"server": config.server_block()},
            warm_up_requests=WARM_UP_REQUESTS,
            scrape_metrics=server.url + "/metrics",
        )
    print(f"{name}: {summary.n_requests} requests, {summary.status_counts}")
    return target


def record_probe(out: Path) -> Path:
    """Probe a fresh server (as ``simpy-llm calibrate probe`` does, its default budget) into
    ``out/llamacpp_probe``; returns that directory."""
    from simpy_llm.calibrate.probe import run_probe
    from simpy_llm.observe.llamacpp import LlamaCppConfig, LlamaCppServer

    config = LlamaCppConfig(port=0, parallel=4, threads=1, cache_prompt=True)
    target = out / "llamacpp_probe"
    with LlamaCppServer(config) as server:
        _prewarm(server)
        # named relative to the working directory (the repository root), as the profile records it
        result = run_probe(server.url, os.path.relpath(target), server_type="llamacpp",
                           server_config={"server": config.server_block()})
    print(f"probe: {result.statistics['duration_s']:.0f} s, warnings: {result.warnings}")
    return target


def _prewarm(server: object) -> None:
    """Load every slot for a while before recording: a fresh server's first minute of steps
    ran up to a third slower in the first recordings (first use of its buffers and the
    machine's clock settling), which no model of a steady server should be fitted to."""
    import asyncio

    from simpy_llm.observe.client import OpenAIClient, RequestSpec
    from simpy_llm.observe.prompts import SyntheticPrompts

    words = SyntheticPrompts()

    async def go() -> None:
        async with OpenAIClient(server.url) as client:
            for wave in range(3):
                specs = [
                    RequestSpec(words.text(100 + 150 * i, 10_000 + 10 * wave + i), 48, "completions",
                                extra_body={"ignore_eos": True, "cache_prompt": False})
                    for i in range(4)
                ]
                await asyncio.gather(*(client.send(spec) for spec in specs))

    asyncio.run(go())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=sorted([*RUNS, "probe", *SETS]),
                        help="record one workload, the probe, or a set of them (SETS) only")
    parser.add_argument("--out", type=Path, default=HERE, help="where to write (default: this folder)")
    args = parser.parse_args()
    names = SETS.get(args.only) or ([args.only] if args.only else [*FIRST_DAY, "probe"])
    # a later held-out set has a probe and a fitting trace of its own, kept apart from the first's
    out = args.out / f"llamacpp_{args.only}" if args.only in SETS and args.only != "held_out" else args.out
    for name in names:
        if name == "probe":
            record_probe(out)
        else:
            record(name, out)
    if "open_loop" in names:
        from simpy_llm.calibrate.fit import fit, write_profile

        # named relative to the working directory (the repository root), as the profile records it
        result = fit(os.path.relpath(args.out / "llamacpp_open_loop"))
        print(f"wrote {write_profile(result, args.out / 'llamacpp_open_loop_profile.yaml')}")


if __name__ == "__main__":
    main()
