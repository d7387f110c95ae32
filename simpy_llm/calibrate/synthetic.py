"""Observed traces made by the simulator: the calibrator's ground truth.

:func:`simulated_observation` runs a scenario and writes what an observer
would have recorded had the simulated server been real: a trace v2 in the
observer's layout (send, first-token and last-token times, the gaps between
tokens, server-side cached tokens) with ``mode: simulated`` and a header
``server`` block of type ``emulated`` that carries the scenario's serving
section. Fitting such a trace must give back the scenario's coefficients, and
comparing it with its own scenario must give errors of zero: the
identifiability checks of ``docs/calibration.md``.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np

from simpy_llm.config import Scenario
from simpy_llm.metrics.record import TRACE_COLUMNS
from simpy_llm.simulation import Simulation
from simpy_llm.workload.traces import OBSERVED_COLUMNS, V2_COLUMNS, emulated_server_block, write_trace_v2

__all__ = ["simulated_observation"]


def simulated_observation(scenario: Scenario, path: Path | str, *, warm_up_requests: int = 0) -> tuple[Path, Path]:
    """Simulate *scenario* and write its requests as an observed trace v2 at *path* (a stem,
    directory or CSV path; see :func:`~simpy_llm.workload.traces.trace_v2_paths`).

    Every request is "sent" at its arrival; streamed ones get their token times
    (one event per engine step, so the run uses ``event_per_step``: same records);
    dropped requests are written with status ``error``. Returns the header and CSV paths.
    """

    per_step = scenario.replace(**{"simulation.mode": "event_per_step"})
    times: dict[int, list[float]] = {}

    def listener(req: Any, _tokens: int, visible_s: float) -> None:
        times.setdefault(req.id, []).append(visible_s)

    records = Simulation(per_step, token_listener=listener).run(progress=False).to_dataframe()

    def us(values: Any) -> np.ndarray:
        return np.rint(np.asarray(values, dtype=float) * 1e6)

    rows: list[dict[str, Any]] = []
    for r in records.itertuples(index=False):
        t = times.get(r.request_id, [])
        ok = r.status == "completed"
        send = int(us(r.arrival_s))
        token_us = [int(v) for v in us(t)] if (ok and t) else []
        row = {column: getattr(r, name) for name, column in TRACE_COLUMNS.items()}
        row.update(
            arrival_time_us=send,
            send_time_us=send,
            first_chunk_time_us=token_us[0] if token_us else None,
            first_token_time_us=token_us[0] if token_us and r.streaming else None,
            last_chunk_time_us=token_us[-1] if token_us else None,
            done_time_us=token_us[-1] if token_us else None,
            num_chunks=len(token_us) if r.streaming else (1 if ok else 0),
            status="ok" if ok else "error",
            error_message="" if ok else f"dropped: {r.dropped_reason}",
            cached_tokens=int(r.cached_tokens) if ok else None,
            itl_us=" ".join(str(b - a) for a, b in itertools.pairwise(token_us)) if r.streaming else "",
            prompt_tokens_source="usage",
            completion_tokens_source="usage",
        )
        rows.append(row)
    import pandas as pd

    frame = pd.DataFrame(rows, columns=[c for c in (*V2_COLUMNS, *OBSERVED_COLUMNS) if c in rows[0]] if rows else None)
    header = {
        "mode": "simulated",
        "created_at": "1970-01-01T00:00:00Z",  # no wall clock: the same scenario gives the same file
        "warm_up_requests": warm_up_requests,
        "server": emulated_server_block(scenario, scenario.name or "simulated"),
        "network": {"measured_rtt_ms": 0.0},
    }
    return write_trace_v2(frame, path, header=header)
