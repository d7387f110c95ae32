"""Fused vs distributed vs hybrid speculative decoding under a round-trip sweep.

Runs ``scenarios/speculative_modes.yaml`` in each mode at each draft round trip and
prints median TPOT, goodput and (for hybrid) the share of requests it ran fused::

    python3 benchmarks/speculative_modes.py [--rtt-ms 5 20 50 100 200] [--requests 400]

Deterministic: the same command prints the same table (docs/speculative.md quotes it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from simpy_llm.explore.sweeps import sweep

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "speculative_modes.yaml"
MODES = {
    "distributed": {"speculation.mode": "distributed", "speculation.mode_selector": None, "speculation.fused": None},
    "fused": {"speculation.mode": "fused", "speculation.mode_selector": None},
    "hybrid": {},
}


def compare(rtts_ms: list[float], requests: int) -> list[dict[str, object]]:
    """One row per round trip: each mode's median TPOT (ms) and goodput, hybrid's fused share."""
    grid = {"speculation.drafts.0.network.rtt_ms": rtts_ms}
    frames = {
        mode: sweep(SCENARIO, grid, overrides={"workload.num_requests": requests, **fixed})
        for mode, fixed in MODES.items()
    }
    rows = []
    for i, rtt in enumerate(rtts_ms):
        row: dict[str, object] = {"rtt_ms": rtt}
        for mode, frame in frames.items():
            row[f"{mode}_tpot_p50_ms"] = round(frame["latency_s.tpot.p50"].iloc[i] * 1e3, 2)
            row[f"{mode}_goodput"] = round(frame["goodput.fraction"].iloc[i], 3)
        hybrid = frames["hybrid"]
        fused = hybrid["speculation.requests_by_mode[fused]"].iloc[i]
        total = fused + hybrid["speculation.requests_by_mode[distributed]"].iloc[i]
        row["hybrid_fused_share"] = round(fused / total, 3)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtt-ms", type=float, nargs="+", default=[5.0, 20.0, 50.0, 100.0, 200.0])
    parser.add_argument("--requests", type=int, default=400)
    args = parser.parse_args()
    rows = compare(args.rtt_ms, args.requests)
    header = list(rows[0])
    print(" | ".join(header))
    for row in rows:
        print(" | ".join(str(row[k]) for k in header))


if __name__ == "__main__":
    main()
