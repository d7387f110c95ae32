"""What a run's sessions did: the multi-turn sessions that ended, and the agentic sessions
with their tool calls (``docs/agentic.md``), with the summary's ``sessions`` and
``workflows`` sections.

:class:`~simpy_llm.metrics.results.Results` shows them as ``sessions()``,
``workflow_sessions()``, ``tool_calls()`` and those sections of ``summary()``
(:class:`~simpy_llm.metrics.summary.SessionStats`, :class:`~simpy_llm.metrics.summary.WorkflowStats`).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from simpy_llm.metrics.stats import latency_stats

if TYPE_CHECKING:
    import pandas as pd

    from simpy_llm.metrics.summary import SessionStats, WorkflowStats

__all__ = ["SessionResults", "SessionSection", "WorkflowResults", "WorkflowSection"]

_WORKFLOW_FIELDS = ["session_id", "client_id", "workflow", "start_s", "end_s", "llm_calls", "tool_calls", "tool_wait_s",
                    "iterations", "fan_out_planned", "fan_out_done", "critical_queue_s", "end_reason"]
"""An agentic session's fields as the recorder keeps them (:func:`~simpy_llm.workload.sessions.session_record`)."""
_TOOL_CALL_FIELDS = ["session_id", "client_id", "step_id", "tool", "loop_iteration", "instance", "start_s", "wait_s", "end_s",
                     "latency_s", "output_tokens"]
"""A tool call's fields as the recorder keeps them (:meth:`~simpy_llm.metrics.recorder.Recorder.on_tool_call`)."""


class SessionSection(TypedDict):
    """The summary's ``sessions`` section."""

    sessions: SessionStats


class WorkflowSection(TypedDict, total=False):
    """The summary's ``workflows`` section (absent without agentic sessions)."""

    workflows: dict[str, WorkflowStats]


class SessionResults:
    """The multi-turn and conversational sessions that ended (every session, warm-up included).

    Parameters
    ----------
    ended
        ``(session_id, client_id, rounds, end_reason)`` per ended session.
    """

    def __init__(self, ended: list[tuple[str, str, int, str]]) -> None:
        self.ended = ended

    def to_dataframe(self) -> pd.DataFrame:
        """One row per session: session_id, client_id, rounds (created), end_reason."""
        import pandas as pd  # pandas is imported where a frame is built: importing the package stays fast

        return pd.DataFrame(sorted(self.ended), columns=["session_id", "client_id", "rounds", "end_reason"]).astype(
            {"session_id": "string", "client_id": "string", "rounds": "int64", "end_reason": "string"}
        )

    def summary(self) -> SessionSection:
        """``{"sessions": ...}``: how many ended, their mean rounds and their end reasons."""
        reasons: dict[str, int] = {}
        for *_rest, reason in self.ended:
            reasons[reason] = reasons.get(reason, 0) + 1
        rounds = [r for _, _, r, _ in self.ended]
        return {"sessions": {
            "count": len(self.ended),
            "mean_rounds": float(np.mean(rounds)) if rounds else None,
            "end_reasons": dict(sorted(reasons.items())),
        }}


class WorkflowResults:
    """The agentic sessions of a run and their tool calls.

    Parameters
    ----------
    sessions
        Per agentic session, its record (:func:`~simpy_llm.workload.sessions.session_record`).
    tool_calls
        Per tool call that returned, its record (:meth:`~simpy_llm.metrics.recorder.Recorder.on_tool_call`).
    """

    def __init__(self, sessions: list[tuple], tool_calls: list[tuple]) -> None:
        self.sessions = sessions
        self.tool_calls = tool_calls

    def to_dataframe(self) -> pd.DataFrame:
        """One row per agentic session, in session-id order (see
        :meth:`Results.workflow_sessions() <simpy_llm.metrics.results.Results.workflow_sessions>`)."""
        import pandas as pd  # pandas is imported where a frame is built: importing the package stays fast

        columns = _WORKFLOW_FIELDS
        frame = pd.DataFrame(sorted(self.sessions), columns=columns)
        frame = frame.astype({"session_id": "string", "client_id": "string", "workflow": "string", "end_reason": "string",
                              "start_s": "float64", "end_s": "float64", "tool_wait_s": "float64", "critical_queue_s": "float64",
                              "llm_calls": "int64", "tool_calls": "int64", "iterations": "int64",
                              "fan_out_planned": "int64", "fan_out_done": "int64"})
        frame.insert(5, "e2e_s", frame["end_s"] - frame["start_s"])
        with np.errstate(invalid="ignore", divide="ignore"):
            frame["critical_queue_share"] = frame["critical_queue_s"] / frame["e2e_s"]
        return frame[[*columns[:5], "e2e_s", *columns[5:12], "critical_queue_share", "end_reason"]]

    def tool_call_frame(self) -> pd.DataFrame:
        """One row per tool call that returned, in (session, start) order (see
        :meth:`Results.tool_calls() <simpy_llm.metrics.results.Results.tool_calls>`)."""
        import pandas as pd  # pandas is imported where a frame is built: importing the package stays fast

        rows = sorted(self.tool_calls, key=lambda r: (r[0], r[6], r[2], r[4], r[5]))
        return pd.DataFrame(rows, columns=_TOOL_CALL_FIELDS).astype(
            {"session_id": "string", "client_id": "string", "step_id": "string", "tool": "string",
             "loop_iteration": "int64", "instance": "int64", "start_s": "float64", "wait_s": "float64",
             "end_s": "float64", "latency_s": "float64", "output_tokens": "int64"}
        )

    def summary(self) -> WorkflowSection:
        """``{"workflows": ...}``, per workflow; empty without agentic sessions."""
        if not self.sessions:
            return {}
        frame = self.to_dataframe()
        out: dict[str, WorkflowStats] = {}
        for name in sorted(set(frame["workflow"].tolist())):
            f = frame[frame["workflow"] == name]
            done = f[f["end_reason"].isin(["completed", "max_rounds", "user_stopped"])]
            iters = f["iterations"].to_numpy()
            planned = int(f["fan_out_planned"].sum())
            share = done["critical_queue_share"].to_numpy(np.float64)
            out[name] = {
                "sessions": len(f),
                "completed": len(done),
                "end_reasons": dict(sorted(Counter(f["end_reason"].tolist()).items())),
                "e2e_s": latency_stats(done["e2e_s"].to_numpy(np.float64)),
                "llm_calls_mean": float(f["llm_calls"].mean()) if len(f) else None,
                "tool_calls_mean": float(f["tool_calls"].mean()) if len(f) else None,
                "tool_wait_s_mean": float(f["tool_wait_s"].mean()) if len(f) else None,
                "iterations": {
                    "mean": float(iters.mean()) if iters.size else None,
                    "histogram": {str(k): v for k, v in sorted(Counter(iters.tolist()).items())},
                },
                "fan_out_utilization": int(f["fan_out_done"].sum()) / planned if planned else None,
                "critical_queue_share_mean": float(share[~np.isnan(share)].mean()) if (~np.isnan(share)).any() else None,
            }
        return {"workflows": out}
