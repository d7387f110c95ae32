"""Record the llama.cpp benchmark in this folder: a fit from two short runs, then the sweep it predicts (about 8 minutes).

Run from the repository root, with the ``real-server`` extra installed, on a machine that is
otherwise idle (other work on the cores shows up in the server's step times)::

    python -m tests.data.bench.record_benchmark [--out DIR]

One fresh llama.cpp server (``LlamaCppServer``: 8 slots of 2,048 tokens, 2 threads, prompt cache
off), loaded for a while first (as ``tests/data/calibration/record.py`` does), serves, one
after the other, ``simpy-llm bench run`` of synthetic prompts of 128 tokens asking 64 output
tokens (``--ignore-eos``), counted by the server's ``/tokenize``:

* ``llamacpp_bench/probe/``: ``simpy-llm calibrate probe`` (about a minute: each batch size of
  1 to 8 decoders on its own, which two short runs do not separate; the probe pins each
  ``decode.N`` to slots 0 .. N-1 with ``id_slot``, one pass of consecutive slots, as its
  trace header's ``probe.pinned_slots`` records; a probe recorded before it did not);
* ``llamacpp_bench/fit_synchronous/``: ``--profile synchronous``, 12 requests;
* ``llamacpp_bench/fit_rate/``: ``--profile constant`` at 1.5 times the synchronous run's
  request rate, 32 requests;
* ``llamacpp_bench/sweep/``: ``--profile sweep --rates 4``, 40 requests per run (the
  benchmark predicted).

Two threads and eight slots because a server gains from batching only so: on a 2-core AMD EPYC,
one thread decodes two or four sequences no faster than one after the other (13.5 ms a step
alone, 44.5 ms for two, 60 ms for four), which leaves a sweep no rate between the synchronous
one and saturation; two threads with eight slots decode eight sequences at 2.4 times the
synchronous token rate.

Then it fits the synchronous run with the probe's profile as priors
(``fit_synchronous/profile.yaml``: "either fit alone"), and the synchronous and the rate run
together, in one fit whose loss covers both runs' requests, with the probe's profile as priors
(``llamacpp_bench/profile.yaml``), as ``simpy-llm calibrate fit SYNC RATE --priors`` does. The tests read the committed files; they never record.

Every figure ``docs/calibration.md`` gives for the benchmark and
``tests/calibrate/test_bench_llamacpp.py`` asserts (the sweep's errors run by run, the
saturation rate, the MAPE, "either fit alone", "one KV cache", each profile's ``D(k)`` with
its interval and source, the fits' warnings) is printed from a recorded folder by::

    python -m tests.data.bench.record_benchmark --figures [--out DIR]

and ``--refit`` fits the profiles again from the recorded runs first (:func:`fit_profiles`).

(:func:`figures`; the test computes them with :func:`predicted_errors`, the same function).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
LENGTHS = ["--dataset", "synthetic", "--input-len", "128", "--output-len", "64", "--ignore-eos"]


METRICS = ("median_ttft_ms", "p99_ttft_ms", "median_e2el_ms", "p99_e2el_ms")
"""The errors the benchmark's table gives per run, in its column order."""


def predicted_errors(folder: Path, profile: Path, out: Path, *, ubatch_split: str | None = None) -> dict[str, Any]:
    """The recorded sweep in *folder* (``llamacpp_bench``) predicted run by run with *profile*
    (the serving system its first run's trace header describes, the engine's ``ubatch_split``
    replaced when given), with its errors (:func:`~simpy_llm.calibrate.bench_predict.bench_errors`);
    the predicted runs are written in *out*."""
    from simpy_llm.calibrate.bench_predict import bench_errors, predict_measured
    from simpy_llm.calibrate.scenario import scenario_from_trace
    from simpy_llm.loading import scenario_from_dict, scenario_to_dict

    measured = json.loads((folder / "sweep" / "bench.json").read_text())
    scenario = scenario_from_trace(folder / "sweep" / "rate_0" / "trace", profile=profile)
    if ubatch_split is not None:
        data = scenario_to_dict(scenario)
        data["serving"]["engine"]["ubatch_split"] = ubatch_split
        scenario = scenario_from_dict(data)
    return bench_errors(measured["runs"], predict_measured(scenario, folder / "sweep", out)["runs"])


def _percent(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f} %".replace("-", "\u2212")


def _errors_table(scored: dict[str, Any]) -> list[str]:
    lines = ["| run | measured requests/s | TTFT p50 | TTFT p99 | E2E p50 | E2E p99 |", "|---|---|---|---|---|---|"]
    for r in scored["runs"]:
        rate = r["request_rate"]
        name = r["strategy"] if r["strategy"] != "constant" else f"constant {float(rate):.3f}/s"
        lines.append(f"| {name} | {r['request_throughput']:.3f} | " + " | ".join(_percent(r[m]) for m in METRICS) + " |")
    sat = scored["saturation"]
    if sat is not None:
        lines.append(f"saturation: measured {sat['measured']:.3f}/s, predicted {sat['predicted']:.3f}/s ({_percent(sat['error'])})")
    lines.append("MAPE below saturation: " + ", ".join(f"{m} {100 * v:.1f} %" for m, v in scored["mape"].items() if v is not None))
    # The same figures as the test asserts them (fractions to 1e-4), to paste.
    for m in ("median_e2el_ms", "median_ttft_ms"):
        lines.append(f"test: {m} {[None if r[m] is None else round(r[m], 4) for r in scored['runs']]}, "
                     f"mape {None if scored['mape'][m] is None else round(scored['mape'][m], 4)}")
    if sat is not None:
        lines.append(f"test: saturation ({sat['measured']:.4f}, {sat['predicted']:.4f}), error {sat['error']:.4f}")
    return lines


def _profile_lines(path: Path) -> list[str]:
    doc = yaml.safe_load(path.read_text())
    fit = doc.get("fit", {})
    decode = doc["latency_model"]["params"]["decode_step_us"]
    intervals = (fit.get("intervals") or {}).get("decode_step_us") or [None] * len(decode)
    sources = (fit.get("sources") or {}).get("decode_step_us") or ["?"] * len(decode)
    lines = [f"{path}: D(1..{len(decode)}) = " + ", ".join(f"{d / 1e3:.1f}" for d in decode) + " ms"]
    for k, (d, iv, src) in enumerate(zip(decode, intervals, sources, strict=True), start=1):
        span = "no interval" if not iv or iv[0] is None else f"[{iv[0] / 1e3:.1f}, {iv[1] / 1e3:.1f}]"
        lines.append(f"  D({k}) = {d / 1e3:.1f} ms {span} ({src})")
    pinned = None
    if fit.get("method") == "probe":
        header = yaml.safe_load((path.parent / "trace.yaml").read_text())
        pinned = (header.get("probe") or {}).get("pinned_slots")
        lines.append(f"  slots pinned: {pinned if pinned is not None else 'no (the server chose)'}")
    lines += [f"  warning: {w}" for w in fit.get("warnings", [])]
    return lines


def figures(folder: Path) -> str:
    """Every figure of the benchmark recorded in *folder* (``llamacpp_bench``), as text: the three
    profiles' decode tables (value, interval, source) and warnings, then the sweep predicted with
    the final fit, with the synchronous fit alone ("either fit alone") and with the final fit as
    one KV cache ("one KV cache")."""
    lines: list[str] = []
    for name in ("probe/profile.yaml", "fit_synchronous/profile.yaml", "profile.yaml"):
        lines += [*_profile_lines(folder / name), ""]
    cases = [("the final fit (profile.yaml)", folder / "profile.yaml", None),
             ("either fit alone: the synchronous fit on the probe's priors", folder / "fit_synchronous" / "profile.yaml", None),
             ("one KV cache: the final fit with passes in order (ubatch_split: simple)", folder / "profile.yaml", "simple")]
    with tempfile.TemporaryDirectory() as tmp:
        for k, (title, profile, split) in enumerate(cases):
            scored = predicted_errors(folder, profile, Path(tmp) / str(k), ubatch_split=split)
            lines += [f"## {title}", *_errors_table(scored), ""]
    return "\n".join(lines)


def main() -> None:
    from simpy_llm.cli import main as cli
    from simpy_llm.observe.llamacpp import LlamaCppConfig, LlamaCppServer
    from tests.data.calibration.record import _prewarm

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="where to write (default: this folder)")
    parser.add_argument("--figures", action="store_true",
                        help="record nothing: print every figure of the benchmark already recorded in --out")
    parser.add_argument("--refit", action="store_true",
                        help="record nothing: fit the profiles again from the runs recorded in --out, then print the figures")
    args = parser.parse_args()
    # named relative to the working directory (the repository root), as the headers record them
    out = Path(os.path.relpath(args.out / "llamacpp_bench"))
    if args.refit:
        fit_profiles(out)
    if args.figures or args.refit:
        print(figures(out))
        return
    config = LlamaCppConfig(port=0, parallel=8, threads=2, cache_prompt=False)
    server_config = out / "server.yaml"
    out.mkdir(parents=True, exist_ok=True)
    with LlamaCppServer(config) as server:
        server_config.write_text(yaml.safe_dump({"server": config.server_block()}, sort_keys=False))
        common = ["--url", server.url, *LENGTHS, "--percentiles", "50,99", "--server-type", "llamacpp",
                  "--server-config", str(server_config)]
        _prewarm(server)
        assert cli(["calibrate", "probe", "--url", server.url, "--server-type", "llamacpp", "--server-config",
                    str(server_config), "--seed", "7", "--out", str(out / "probe")]) == 0
        assert cli(["bench", "run", *common, "--profile", "synchronous", "--num-prompts", "12", "--out", str(out / "fit_synchronous")]) == 0
        sync_rate = json.loads((out / "fit_synchronous" / "bench.json").read_text())["runs"][0]["request_throughput"]
        assert cli(["bench", "run", *common, "--profile", "constant", "--request-rate", f"{1.5 * sync_rate:.4f}",
                    "--num-prompts", "32", "--out", str(out / "fit_rate")]) == 0
        assert cli(["bench", "run", *common, "--profile", "sweep", "--rates", "4", "--num-prompts", "40", "--out", str(out / "sweep")]) == 0
    fit_profiles(out)
    print(figures(out))


def fit_profiles(folder: Path) -> None:
    """Fit the recorded runs in *folder* (``llamacpp_bench``): the synchronous run alone with the
    probe's profile as priors, then the synchronous and the rate run together (one fit, one loss
    over both runs' requests) with the probe's profile as priors."""
    from simpy_llm.calibrate.fit import fit, write_profile

    probe = folder / "probe" / "profile.yaml"
    sync = fit(folder / "fit_synchronous" / "rate_0", priors=probe)
    write_profile(sync, folder / "fit_synchronous" / "profile.yaml")
    both = fit([folder / "fit_synchronous" / "rate_0", folder / "fit_rate" / "rate_0"], priors=probe)
    print(f"wrote {write_profile(both, folder / 'profile.yaml')}")


if __name__ == "__main__":
    main()
