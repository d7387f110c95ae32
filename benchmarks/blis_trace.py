"""A seeded request trace for comparing this simulator with BLIS, in both simulators' input formats.

BLIS (the Blackbox Inference Simulator, github.com/inference-sim/inference-sim) replays a CSV
of recorded requests (``run --workload traces --workload-traces-filepath FILE``), one row a
request: ``arrival_time`` in seconds, ``request_id`` and ``model`` (both ignored), and the
prompt and output as JSON arrays of token ids (``prefill_tokens``, ``decode_tokens``), whose
lengths are the request's lengths. BLIS reads an arrival as ``int64(seconds * 1e6)``
microseconds (truncated), so the seconds are written as ``<whole µs>.5 µs`` and read back as
exactly the whole microseconds this project's trace v2 holds (``arrival_time_us``).

The requests (``requests_frame``): Poisson arrivals at ``rate`` requests/s; prompts
lognormal (``mu`` 6.0, ``sigma`` 0.8 of log tokens: median ~400, as the quickstart's chat
client) rounded, 1 to 1,536 tokens; outputs exponential (mean 200 tokens) rounded up, at
least 1 and at most ``MAX_MODEL_LEN - prompt``, so that no request is longer than BLIS's
``--max-model-len`` default of 2,048 (the versions that had one) and none is dropped by either
simulator. Token ids are drawn uniformly from Llama 3's vocabulary by a stream of their own:
no two prompts share a first block, so BLIS's prefix cache (always on) finds nothing, as
this project's finds nothing in a trace without ``prefix_blocks``. Everything follows from
the seed: the same arguments write byte-identical files (the trace v2 header's
``created_at`` is fixed).

Run from the repository root::

    python -m benchmarks.blis_trace --out /tmp/blis100k                # trace v2: /tmp/blis100k/trace.{yaml,csv}
    python -m benchmarks.blis_trace --out /tmp/blis100k --blis         # and BLIS's CSV: /tmp/blis100k/blis_trace.csv
    python -m benchmarks.blis_trace --out data/blis_linear --requests 2000   # the committed small trace

Then ``simpy-llm run scenarios/blis_linear.yaml --set workload.traces.0.path=/tmp/blis100k/trace.csv``
against (BLIS, by hand; its blackbox coefficients come with ``--model``, ``--hardware`` and
``--tp``)::

    ./simulation_worker run --model meta-llama/llama-3.1-8b-instruct --hardware H100 --tp 2 \\
        --vllm-version vllm/vllm-openai:v0.8.4 --workload traces \\
        --workload-traces-filepath /tmp/blis100k/blis_trace.csv

The 100k-request BLIS file is ~0.5 GB (one token id per token); the trace v2 is ~9 MB.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simpy_llm.workload.traces import write_trace_v2

__all__ = [
    "BLIS_COLUMNS",
    "DEFAULT_RATE",
    "DEFAULT_REQUESTS",
    "DEFAULT_SEED",
    "MAX_MODEL_LEN",
    "MAX_PROMPT",
    "MODEL",
    "VOCAB",
    "blis_arrival_text",
    "read_blis_csv",
    "requests_frame",
    "write_blis_csv",
    "write_trace",
]

DEFAULT_REQUESTS = 100_000
DEFAULT_SEED = 42
DEFAULT_RATE = 20.0
"""Requests per second (the quickstart's aggregate rate)."""
MAX_MODEL_LEN = 2048
"""Longest prompt + output: BLIS's ``--max-model-len`` default where it has one."""
MAX_PROMPT = 1536
VOCAB = 128_256
"""Llama 3's vocabulary size: token ids are drawn from ``[0, VOCAB)``."""
MODEL = "meta-llama/llama-3.1-8b-instruct"
"""The model BLIS's CSV names (BLIS ignores the column and uses ``--model``)."""
BLIS_COLUMNS = ("arrival_time", "request_id", "model", "prefill_tokens", "decode_tokens")
CREATED_AT = "2026-11-27T00:00:00Z"
"""The trace v2 header's ``created_at``: fixed, so the files depend on the arguments only."""


def requests_frame(n: int = DEFAULT_REQUESTS, seed: int = DEFAULT_SEED, rate: float = DEFAULT_RATE) -> pd.DataFrame:
    """The *n* requests: ``arrival_time_us`` (int64, non-decreasing), ``input_tokens`` and
    ``output_tokens`` (int64, each >= 1, their sum <= :data:`MAX_MODEL_LEN`).

    >>> f = requests_frame(5, seed=1)
    >>> list(f.columns), len(f), bool((f.input_tokens + f.output_tokens <= MAX_MODEL_LEN).all())
    (['arrival_time_us', 'input_tokens', 'output_tokens'], 5, True)
    >>> requests_frame(5, seed=1).equals(f), requests_frame(8, seed=1).head(5).equals(f)
    (True, True)
    """
    # One stream per column, each drawn one value a request: the first k requests of a longer
    # trace are the k-request trace.
    gaps, prompts, outputs = (np.random.default_rng([seed, 0, i]) for i in range(3))
    arrival_us = np.rint(np.cumsum(gaps.exponential(1.0 / rate, n)) * 1e6).astype(np.int64)
    prompt = np.clip(np.rint(prompts.lognormal(6.0, 0.8, n)), 1, MAX_PROMPT).astype(np.int64)
    output = np.clip(np.ceil(outputs.exponential(200.0, n)), 1, MAX_MODEL_LEN - prompt).astype(np.int64)
    return pd.DataFrame({"arrival_time_us": arrival_us, "input_tokens": prompt, "output_tokens": output})


def write_trace(frame: pd.DataFrame, path: Path | str, *, seed: int, rate: float) -> tuple[Path, Path]:
    """Write *frame* as a trace v2 (``<stem>.yaml`` + ``<stem>.csv``; *path* as
    :func:`~simpy_llm.workload.traces.trace_v2_paths` takes it) with a header naming how it
    was made; returns both paths."""
    header = {
        "created_at": CREATED_AT,
        "mode": "generated",
        "seed": int(seed),
        "workload_spec": f"benchmarks/blis_trace.py --requests {len(frame)} --seed {seed} --rate {rate!r}",
    }
    return write_trace_v2(frame, path, header)


def blis_arrival_text(arrival_us: int) -> str:
    """The ``arrival_time`` cell (seconds) that BLIS reads back as *arrival_us*: half a
    microsecond more than it, so that BLIS's truncation of ``seconds * 1e6`` lands on it.

    >>> blis_arrival_text(0), blis_arrival_text(1_234_567)
    ('0.0000005', '1.2345675')
    >>> int(float(blis_arrival_text(4_999_999_999)) * 1e6)
    4999999999
    """
    whole, frac = divmod(int(arrival_us), 1_000_000)
    return f"{whole}.{frac:06d}5"


def write_blis_csv(frame: pd.DataFrame, path: Path | str, *, seed: int) -> Path:
    """Write *frame*'s requests as BLIS's trace CSV (:data:`BLIS_COLUMNS`) at *path*.

    Token ids come from a random stream of their own (``[seed, 1]``), drawn one request at a
    time in row order, so the lengths do not depend on them.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, 1])
    arrivals = frame["arrival_time_us"].tolist()
    prompts = frame["input_tokens"].tolist()
    outputs = frame["output_tokens"].tolist()
    with path.open("w", encoding="utf-8", newline="") as f:
        f.write(",".join(BLIS_COLUMNS) + "\n")
        for i, (t, p, o) in enumerate(zip(arrivals, prompts, outputs, strict=True)):
            ids = rng.integers(0, VOCAB, p + o).tolist()
            prefill = ",".join(map(str, ids[:p]))
            decode = ",".join(map(str, ids[p:]))
            f.write(f'{blis_arrival_text(t)},request_{i},{MODEL},"[{prefill}]","[{decode}]"\n')
    return path


def read_blis_csv(path: Path | str) -> pd.DataFrame:
    """The requests of a BLIS trace CSV as BLIS reads them: ``arrival_time_us`` =
    ``int(seconds * 1e6)`` (truncated), the lengths of the two token arrays; rows in file order."""
    arrival: list[int] = []
    prompt: list[int] = []
    output: list[int] = []
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        next(reader)
        for row in reader:
            arrival.append(int(float(row[0]) * 1e6))
            prompt.append(len(json.loads(row[3])))
            output.append(len(json.loads(row[4])))
    return pd.DataFrame(
        {
            "arrival_time_us": np.array(arrival, dtype=np.int64),
            "input_tokens": np.array(prompt, dtype=np.int64),
            "output_tokens": np.array(output, dtype=np.int64),
        }
    )


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.blis_trace", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, metavar="DIR", help="write DIR/trace.yaml, DIR/trace.csv (and DIR/blis_trace.csv)")
    p.add_argument("--requests", type=int, default=DEFAULT_REQUESTS, help=f"number of requests (default {DEFAULT_REQUESTS:,})")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"seed (default {DEFAULT_SEED})")
    p.add_argument("--rate", type=float, default=DEFAULT_RATE, help=f"requests per second (default {DEFAULT_RATE})")
    p.add_argument("--blis", action="store_true", help="also write BLIS's CSV (token ids: ~5 KB a request)")
    args = p.parse_args(argv)
    out = Path(args.out)
    frame = requests_frame(args.requests, args.seed, args.rate)
    written: list[Any] = list(write_trace(frame, out / "trace", seed=args.seed, rate=args.rate))
    if args.blis:
        written.append(write_blis_csv(frame, out / "blis_trace.csv", seed=args.seed))
    print("wrote " + ", ".join(map(str, written)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
