"""What a disaggregated fleet handed off (``docs/network.md``): one row per KV transfer from
a prefill replica to a decode replica, and the summary's ``disaggregation`` section.

:class:`~simpy_llm.metrics.results.Results` shows them as ``kv_transfers()`` and
``summary()["disaggregation"]`` (:class:`~simpy_llm.metrics.summary.DisaggregationStats`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from simpy_llm.metrics.stats import latency_stats

if TYPE_CHECKING:
    import pandas as pd

    from simpy_llm.metrics.summary import DisaggregationStats

__all__ = ["DisaggregationSection", "KvTransferResults"]


class DisaggregationSection(TypedDict, total=False):
    """The summary's ``disaggregation`` section (absent when no KV crossed)."""

    disaggregation: DisaggregationStats


class KvTransferResults:
    """The KV transfers of a run.

    Parameters
    ----------
    transfers
        ``(request_id, prefill replica, decode replica, bytes, start_s, end_s)`` per transfer, as
        six doubles a transfer, flat (the recorder's ``kv_transfers``).
    replica_groups
        Each replica's group name (``None``: not known).
    """

    COLUMNS = ("request_id", "prefill_replica", "decode_replica", "bytes", "start_s", "end_s")

    def __init__(self, transfers: Sequence[float], replica_groups: list[str] | None) -> None:
        # a copy: a view would hold the recorder's buffer, which then could not grow in a run that goes on
        self.transfers = np.array(transfers, dtype=np.float64).reshape(-1, len(self.COLUMNS))
        self.replica_groups = replica_groups

    def to_dataframe(self) -> pd.DataFrame:
        """One row per KV transfer, in request-id order (see
        :meth:`Results.kv_transfers() <simpy_llm.metrics.results.Results.kv_transfers>`)."""
        import pandas as pd  # pandas is imported where a frame is built: importing the package stays fast

        rows = self.transfers[np.lexsort(self.transfers.T[::-1])]  # by request id, then the other fields
        frame = pd.DataFrame({name: rows[:, i] for i, name in enumerate(self.COLUMNS)})
        frame = frame.astype({"request_id": "int64", "prefill_replica": "int64", "decode_replica": "int64"})
        frame["transfer_s"] = frame["end_s"] - frame["start_s"]
        return frame

    def starts(self) -> dict[int, float]:
        """When each handed-off request's transfer started (its prefill replica let it go), by request id."""
        return dict(zip(self.transfers[:, 0].astype(np.int64).tolist(), self.transfers[:, 4].tolist(), strict=True))

    def summary(self) -> DisaggregationSection:
        """``{"disaggregation": ...}``; empty when no KV crossed."""
        if not len(self.transfers):
            return {}
        frame = self.to_dataframe()
        groups = self.replica_groups
        prefill = sorted(set(frame["prefill_replica"].tolist()))
        decode = sorted(set(frame["decode_replica"].tolist()))
        stats: DisaggregationStats = {
            "kv_transfers": len(frame),
            "kv_bytes": float(frame["bytes"].sum()),
            "kv_transfer_s": latency_stats(frame["transfer_s"].to_numpy(np.float64)),
            "by_decode_replica": {str(j): int((frame["decode_replica"] == j).sum()) for j in decode},
            "by_prefill_replica": {str(i): int((frame["prefill_replica"] == i).sum()) for i in prefill},
        }
        if groups is not None:
            stats["groups"] = {str(i): groups[i] for i in prefill + decode}
        return {"disaggregation": stats}
