"""What a run's planner decided (``docs/planner.md``): one row per candidate a tick
evaluated, and the summary's ``planner`` section.

:class:`~simpy_llm.metrics.results.Results` shows them as ``planner_decisions()`` and
``summary()["planner"]`` (:class:`~simpy_llm.metrics.summary.PlannerStats`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from simpy_llm.metrics.summary import PlannerStats
    from simpy_llm.serving.disaggregation_results import KvTransferResults
    from simpy_llm.serving.planner import PlannerLog

__all__ = ["PlannerResults", "PlannerSection"]


class PlannerSection(TypedDict, total=False):
    """The summary's ``planner`` section (absent without a planner)."""

    planner: PlannerStats


class PlannerResults:
    """The planner's side of a run.

    Parameters
    ----------
    log
        What the planner did (``None``: the run had no planner).
    columns
        The record columns (where and when each request ran).
    kv_transfers
        The run's KV transfers (a disaggregated fleet's hand-offs end a request's stay at its
        prefill replica).
    end_s
        The run's simulated duration, s.
    """

    def __init__(
        self, log: PlannerLog | None, *, columns: dict[str, np.ndarray], kv_transfers: KvTransferResults, end_s: float
    ) -> None:
        self.log = log
        self.columns = columns
        self.kv_transfers = kv_transfers
        self.end_s = end_s

    def to_dataframe(self) -> pd.DataFrame:
        """One row per candidate a tick evaluated, one per skipped tick (see
        :meth:`Results.planner_decisions() <simpy_llm.metrics.results.Results.planner_decisions>`);
        empty without a planner."""
        import pandas as pd  # pandas is imported where a frame is built: importing the package stays fast

        from simpy_llm.serving.planner import DECISION_COLUMNS  # here: a run's results import this module without the planner

        rows = self.log.rows if self.log is not None else []
        return pd.DataFrame(rows, columns=list(DECISION_COLUMNS))

    def triggers(self) -> pd.DataFrame:
        """One row per tick a trigger condition brought forward (``planner.ticks``): the tick,
        its time, the trigger, and when its condition became true (earlier than the tick when
        ``ticks.min_gap_s`` held it back); empty without a planner or triggers."""
        import pandas as pd  # pandas is imported where a frame is built: importing the package stays fast

        from simpy_llm.serving.planner import TRIGGER_COLUMNS  # here: a run's results import this module without the planner

        rows = self.log.triggers if self.log is not None else []
        return pd.DataFrame(rows, columns=list(TRIGGER_COLUMNS))

    def summary(self, met: int) -> PlannerSection:
        """``{"planner": ...}`` of a run whose *met* completed measured requests met their SLO;
        empty without a planner."""
        log = self.log
        if log is None:
            return {}
        from simpy_llm.serving.planner import gpu_seconds  # a run with a planner's only

        used = gpu_seconds(self.columns, self.kv_transfers.starts(), log, self.end_s)
        return {"planner": {
            "ticks": log.ticks,
            "changes": log.changes,
            "final": dict(log.final),
            "gpu_seconds": used,
            "mean_gpus": used / self.end_s if self.end_s > 0 else None,
            "goodput_per_gpu_second": met / used if used > 0 else None,
        }}
