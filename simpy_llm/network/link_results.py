"""What a run's network links carried (``docs/network.md``): one row per link, and the
summary's ``network`` section.

:class:`~simpy_llm.metrics.results.Results` shows them as ``links()`` and
``summary()["network"]`` (:class:`~simpy_llm.metrics.summary.NetworkStats`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    import pandas as pd

    from simpy_llm.metrics.summary import LinkFigures, NetworkStats
    from simpy_llm.network.link import LinkStats

__all__ = ["LINK_COLUMNS", "LinkResults", "NetworkSection"]

LINK_COLUMNS = ("link", "messages", "delivered", "dropped", "in_flight", "bytes", "retransmissions", "busy_s",
                "utilisation", "mean_queueing_s", "outage_wait_s")
"""Columns of :meth:`LinkResults.to_dataframe`."""


class NetworkSection(TypedDict, total=False):
    """The summary's ``network`` section (absent when the run had no link)."""

    network: NetworkStats


class LinkResults:
    """The network links of a run: each link's statistics at its end.

    Parameters
    ----------
    link_stats
        :class:`~simpy_llm.network.link.LinkStats` of every link, by name.
    end_s
        The run's simulated duration, s (what a link's utilisation is over).
    """

    def __init__(self, link_stats: dict[str, LinkStats], end_s: float) -> None:
        self.link_stats = link_stats
        self.end_s = end_s

    def figures(self) -> dict[str, LinkFigures]:
        """Each link's figures (:class:`~simpy_llm.metrics.summary.LinkFigures`), by name, in the links' order."""
        span = self.end_s if self.end_s > 0 else float("nan")
        return {
            name: {
                "messages": st.puts, "delivered": st.delivered, "dropped": st.dropped, "in_flight": st.in_flight,
                "bytes": float(st.bytes_delivered), "retransmissions": st.retransmissions, "busy_s": st.busy_s,
                "utilisation": st.utilisation(span), "mean_queueing_s": st.mean_queueing_s,
                "outage_wait_s": st.total_outage_wait_s,
            }
            for name, st in self.link_stats.items()
        }

    def to_dataframe(self) -> pd.DataFrame:
        """One row per link, by name, with its figures at the end of the run (see
        :meth:`Results.links() <simpy_llm.metrics.results.Results.links>`)."""
        import pandas as pd  # pandas is imported where a frame is built: importing the package stays fast

        rows = [{"link": name, **fig} for name, fig in sorted(self.figures().items())]
        return pd.DataFrame(rows, columns=list(LINK_COLUMNS))

    def summary(self) -> NetworkSection:
        """``{"network": {"links": ...}}``, links sorted by name; empty without links."""
        if not self.link_stats:
            return {}
        return {"network": {"links": dict(sorted(self.figures().items()))}}
