"""A run's request table: one record per request, the latencies derived from it, and the
summary's request sections (counts, latency, rates, goodput, prefix cache, fairness).

The metric definitions, which requests each figure covers (measured ones, streaming ones)
and the two windows a rate can divide by are in :mod:`simpy_llm.metrics.results`, whose
:class:`~simpy_llm.metrics.results.Results` shows this table as ``to_dataframe()``,
``records()`` and ``derived()``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, NotRequired, TypedDict

import attrs
import numpy as np

from simpy_llm.metrics.fairness import bin_labels, cohort_fairness, tenant_fairness
from simpy_llm.metrics.record import FRAME_DTYPES, RECORD_FIELDS, RequestRecord
from simpy_llm.metrics.stats import counted_stats, latency_stats, weighted_stats

if TYPE_CHECKING:
    import pandas as pd

    from simpy_llm.config.schema import Scenario
    from simpy_llm.metrics.monitors import WeightedTally
    from simpy_llm.metrics.summary import (
        ClassGoodput,
        ClassLatency,
        ClientLatency,
        Fairness,
        Goodput,
        Latency,
        PrefixCacheStats,
        RequestCounts,
        Throughput,
    )

__all__ = ["DERIVED_METRICS", "LatencySections", "RateSections", "RequestOutcomes", "RequestResults", "WindowedRates"]


DERIVED_METRICS = ("ttft_s", "tpot_s", "e2e_s", "queue_delay_s", "client_ttft_s", "client_e2e_s")
"""The per-request metrics derived from the records, in ``to_dataframe()``'s order."""
_CLIENT_SILENT = ("ttft_s", "tpot_s", "client_ttft_s")
"""The metrics a client that does not stream does not see (:meth:`RequestResults.client_derived`)."""


class _Metrics(dict[str, np.ndarray]):
    """:meth:`RequestResults.derived` over some records as a mapping that computes a metric
    when it is first looked up (what :meth:`RequestResults.slo_met` reads: only the metrics
    an SLO target names)."""

    def __init__(self, requests: RequestResults, mask: np.ndarray) -> None:
        super().__init__()
        self.requests = requests
        self.mask = mask

    def __missing__(self, name: str) -> np.ndarray:
        values = self[name] = self.requests.metric(name, self.mask)
        return values


class WindowedRates(TypedDict):
    """The arrival-window part of ``summary()["throughput"]`` (see :class:`~simpy_llm.metrics.summary.Throughput`)."""

    requests_per_s: float
    output_tokens_per_s: float
    input_tokens_per_s: float
    offered_requests_per_s: float
    window_start_s: float
    window_s: float
    drain_s: float


class LatencySections(TypedDict):
    """The summary's latency sections, in the summary's order."""

    latency_s: Latency
    client_latency_s: NotRequired[ClientLatency]
    latency_s_by_class: dict[str, ClassLatency]
    latency_s_by_tenant: dict[str, ClassLatency]
    latency_s_by_cluster: NotRequired[dict[str, ClassLatency]]


class _ClientSection(TypedDict, total=False):
    client_latency_s: ClientLatency


class _ClusterSection(TypedDict, total=False):
    latency_s_by_cluster: dict[str, ClassLatency]


class RateSections(TypedDict):
    """The summary's ``throughput`` and ``goodput``."""

    throughput: Throughput
    goodput: Goodput


@attrs.frozen(eq=False)
class RequestOutcomes:
    """Which requests each summary figure covers, and the judgements several sections share."""

    measured: np.ndarray
    """Per record: not warm-up."""
    done: np.ndarray
    """Per record: completed and measured."""
    met: np.ndarray
    """Per completed measured request (``done``'s true entries, in order): whether it met its SLO."""
    start_s: float
    """Start of the span the whole-run rates divide by (``summary()["measurement"]``)."""
    run_s: float
    """Length of that span, s."""
    windowed: WindowedRates
    """The arrival window's rates."""
    met_in_window: int
    """Completions inside the arrival window that met their SLO."""

    @property
    def duration_s(self) -> float:
        """``run_s``, NaN when it is 0 (a rate over it is then undefined)."""
        return self.run_s if self.run_s > 0 else math.nan

    @property
    def window_s(self) -> float:
        """The arrival window's length, NaN when it is 0."""
        return self.windowed["window_s"] if self.windowed["window_s"] > 0 else math.nan

    @property
    def goodput_per_s(self) -> float:
        """``goodput.requests_per_s``: SLO-meeting completions per second of the arrival window."""
        return self.met_in_window / self.window_s


class RequestResults:
    """The request records of a run, as columns sorted by request id.

    Parameters
    ----------
    columns
        Record columns (:data:`~simpy_llm.metrics.record.RECORD_FIELDS`, strings decoded).
    scenario
        The scenario run (its SLO targets and clusters).
    end_s
        The run's simulated duration, s.
    replica_groups
        Each replica's group name (``None``: not known).
    """

    def __init__(self, columns: dict[str, np.ndarray], *, scenario: Scenario, end_s: float, replica_groups: list[str] | None) -> None:
        self.columns = columns
        self.scenario = scenario
        self.end_s = end_s
        self.replica_groups = replica_groups

    def __len__(self) -> int:
        return len(self.columns["request_id"])

    # --- views -----------------------------------------------------------
    def records(self) -> Iterator[RequestRecord]:
        """The records as frozen objects, in request-id order."""
        names = [n for n, _ in RECORD_FIELDS]
        cols = [self.columns[n].tolist() for n in names]
        for row in zip(*cols, strict=True):
            yield RequestRecord(**dict(zip(names, row, strict=True)))

    def derived(self) -> dict[str, np.ndarray]:
        """Per-request latency metrics (:mod:`simpy_llm.metrics.results`), aligned with the records."""
        return {name: self.metric(name) for name in DERIVED_METRICS}

    def client_derived(self) -> dict[str, np.ndarray]:
        """:meth:`derived` as clients see it: no TTFT or TPOT for a request that does not stream."""
        return {name: self.metric(name, client=True) for name in DERIVED_METRICS}

    def metric(self, name: str, mask: np.ndarray | None = None, *, client: bool = False) -> np.ndarray:
        """One of :meth:`derived`'s metrics (*client*: of :meth:`client_derived`'s), for the
        records in *mask* (default: every record), computed alone: the summary takes its
        figures one metric at a time, so no more than one is in memory.

        Each value is the same number as in :meth:`derived` (the same operations on the
        same record fields, element by element), whatever the mask.
        """
        c = self.columns

        def col(field: str) -> np.ndarray:
            return c[field] if mask is None else c[field][mask]

        if name == "tpot_s":
            out_tokens = col("output_tokens").astype(np.float64)
            with np.errstate(invalid="ignore", divide="ignore"):
                values = np.where(out_tokens > 1, (col("completion_s") - col("first_token_s")) / (out_tokens - 1), np.nan)
        elif name == "queue_delay_s":
            values = col("first_scheduled_s") - col("enqueue_s")
        else:
            end = col("first_token_s") if name in ("ttft_s", "client_ttft_s") else col("completion_s")
            values = end - col("arrival_s")
            if name in ("client_ttft_s", "client_e2e_s"):
                values = values + (col("upload_s") + col("download_s"))  # 0 unless the client has a network
        if client and name in _CLIENT_SILENT:
            values = np.where(col("streaming") == 0, np.nan, values)
        return values

    def to_dataframe(self) -> pd.DataFrame:
        """One row per request with the record fields, ``replica_group`` (and ``cluster`` in a
        fleet of clusters) and the derived metrics."""
        import pandas as pd  # pandas is imported where a frame is built: importing the package stays fast

        clusters = {"cluster": self.cluster_column()} if self.scenario.serving.clusters else {}
        frame = pd.DataFrame({**self.columns, "replica_group": self.replica_group_column(), **clusters, **self.derived()})
        # Only the columns not already in their dtype are cast (the numbers are, from the
        # recorder). By name: pandas' "str" dtype compares equal to "string".
        for name, dtype in {**FRAME_DTYPES, "replica_group": "string"}.items():
            if dtype is not None and str(frame[name].dtype) != dtype:
                frame[name] = frame[name].astype(dtype)
        return frame

    def cluster_column(self) -> np.ndarray:
        """Each request's cluster (its replica group's; "" when never routed)."""
        of = self.scenario.serving.cluster_of()
        return np.array([of.get(g, "") for g in self.replica_group_column().tolist()], dtype=object)

    def replica_group_column(self) -> np.ndarray:
        """Each request's replica group ("" when never routed or the groups are not known)."""
        replica = self.columns["replica"]
        out = np.full(replica.shape, "", dtype=object)
        if self.replica_groups is not None and replica.size:
            names = np.array([*self.replica_groups, ""], dtype=object)
            # -1 (never routed) indexes the trailing "".
            out = names[replica]
        return out

    # --- summary ---------------------------------------------------------
    def outcomes(self) -> RequestOutcomes:
        """Which requests the summary covers and whether each met its SLO."""
        c = self.columns
        measured = c["warm_up"] == 0
        done = (c["status"] == "completed") & measured
        met = self.slo_met(done, self.derived_over(done))
        start_s, run_s = self.measurement(measured)
        windowed, met_in_window = self.windowed_rates(measured)
        return RequestOutcomes(measured, done, met, start_s, run_s, windowed, met_in_window)

    def derived_over(self, mask: np.ndarray) -> dict[str, np.ndarray]:
        """:meth:`derived` over the records in *mask*, each metric computed when first looked up."""
        return _Metrics(self, mask)

    def counts(self, arrived: int) -> RequestCounts:
        """``summary()["requests"]`` (*arrived*: the recorder's count of arrivals)."""
        status = self.columns["status"]
        by_reason, by_class = self.drop_counts()
        return {
            "arrived": arrived,
            "completed": int((status == "completed").sum()),
            "dropped": int((status == "dropped").sum()),
            "in_flight": int((status == "in_flight").sum()),
            "warm_up": int((self.columns["warm_up"] != 0).sum()),
            "dropped_by_reason": by_reason,
            "dropped_by_class": by_class,
        }

    def latency(self, outcomes: RequestOutcomes, itl: WeightedTally) -> LatencySections:
        """The latency sections: the run's, clients' (with a client network) and per class,
        tenant and cluster (with clusters); *itl* is the engine's tally of token gaps."""
        c = self.columns
        done = outcomes.done
        gapped = outcomes.measured & (c["streaming"] != 0) & (c["generated_tokens"] >= 2)
        gaps = weighted_stats(itl)
        latency: Latency = {
            "ttft": counted_stats(self.metric("ttft_s", done, client=True)),
            "tpot": counted_stats(self.metric("tpot_s", done, client=True)),
            "itl": {"mean": gaps["mean"], "p50": gaps["p50"], "p90": gaps["p90"], "p95": gaps["p95"], "p99": gaps["p99"],
                    "count": gaps["count"], "requests": int(gapped.sum())},
            "e2e": counted_stats(self.metric("e2e_s", done, client=True)),
            "queue_delay": counted_stats(self.metric("queue_delay_s", done, client=True)),
        }
        client: _ClientSection = {}
        if self.has_client_network():
            client["client_latency_s"] = {"ttft": counted_stats(self.metric("client_ttft_s", done, client=True)),
                                          "e2e": counted_stats(self.metric("client_e2e_s", done, client=True))}
        by_cluster: _ClusterSection = {}
        if self.scenario.serving.clusters:
            by_cluster["latency_s_by_cluster"] = self.latency_by(self.cluster_column(), done)
        return {
            "latency_s": latency,
            **client,
            "latency_s_by_class": self.latency_by(c["slo_class"], done),
            "latency_s_by_tenant": self.latency_by(c["tenant_id"], done),
            **by_cluster,
        }

    def rates(self, outcomes: RequestOutcomes) -> RateSections:
        """``throughput`` and ``goodput`` (see "Rates and their windows" in :mod:`simpy_llm.metrics.results`)."""
        c = self.columns
        done, met = outcomes.done, outcomes.met
        duration = outcomes.duration_s
        completed = int(done.sum())
        by_class: dict[str, ClassGoodput] = {}
        classes = c["slo_class"][done]
        for cls_name in sorted(set(classes.tolist())):
            mask = classes == cls_name
            n = int(mask.sum())
            m = int(met[mask].sum())
            by_class[cls_name] = {"completed": n, "met": m, "fraction": m / n if n else math.nan}
        return {
            "throughput": {
                **outcomes.windowed,
                "whole_run_requests_per_s": completed / duration,
                "whole_run_output_tokens_per_s": int(c["output_tokens"][done].sum()) / duration,
                "whole_run_input_tokens_per_s": int(c["prompt_tokens"][done].sum()) / duration,
            },
            "goodput": {
                "requests_per_s": outcomes.goodput_per_s,
                "whole_run_requests_per_s": int(met.sum()) / duration,
                "fraction": float(met.mean()) if completed else math.nan,
                "by_class": by_class,
            },
        }

    def prefix_cache(self, measured: np.ndarray) -> PrefixCacheStats:
        """``summary()["prefix_cache"]``: over the *measured* requests admitted at least once."""
        c = self.columns
        admitted = measured & ~np.isnan(c["first_scheduled_s"])
        cached = int(c["cached_tokens"][admitted].sum())
        prompt = int(c["prompt_tokens"][admitted].sum())
        return {"hit_rate": cached / prompt if prompt > 0 else None, "cached_tokens": cached, "prompt_tokens": prompt}

    def fairness(self, measured: np.ndarray) -> Fairness:
        """``summary()["fairness"]``: across the tenants of the *measured* requests."""
        c = self.columns
        every = bool(measured.all())  # then the columns themselves, not copies

        def of_measured(values: np.ndarray) -> np.ndarray:
            return values if every else values[measured]

        out = tenant_fairness(
            of_measured(c["tenant_id"]),
            of_measured(c["status"]) == "completed",
            of_measured(c["completion_s"]) - of_measured(c["arrival_s"]),
            of_measured(c["output_tokens"]),
        )
        cohorts = self.scenario.metrics.fairness.cohorts
        if cohorts:
            done = (c["status"] == "completed") & measured
            met = np.zeros(len(measured), dtype=bool)
            met[done] = self.slo_met(done, self.derived_over(done))
            with_slo = bool(self.scenario.slo)
            out["cohorts"] = {}
            for cohort in cohorts:
                labels, order = self.cohort_labels(cohort.by, cohort.bins)
                out["cohorts"][cohort.label] = cohort_fairness(
                    cohort.by, labels[measured], done[measured], met[measured], with_slo=with_slo, order=order,
                )
        return out

    def cohort_labels(self, by: str, bins: tuple[int, ...] | None) -> tuple[np.ndarray, list[str] | None]:
        """Each request's group under the cohort key *by* (``metrics.fairness.cohorts``), and the
        groups' order for length bins (None: sorted)."""
        c = self.columns
        if bins is not None:
            return bin_labels(c[by], bins)
        if by == "draft_device":
            return np.array([f"{g}/{d}" for g, d in zip(c["draft_group"].tolist(), c["draft_device"].tolist(), strict=True)], dtype=object), None
        if by == "replica_group":
            return self.replica_group_column(), None
        if by == "cluster":
            return self.cluster_column(), None
        column = {"client": "client_id", "tenant": "tenant_id"}.get(by, by)
        return np.asarray(c[column], dtype=object), None

    def slo_met(self, done: np.ndarray, d: dict[str, np.ndarray]) -> np.ndarray:
        """Whether each request in *done* met every target of its SLO class (*d*: :meth:`derived` over *done*)."""
        classes = self.columns["slo_class"][done]
        met = np.ones(int(done.sum()), dtype=bool)
        for name, target in self.scenario.slo.items():
            mask = classes == name
            # Judged as the client sees it (the same as the server without a client network).
            limits = (
                ("client_ttft_s", target.ttft_s), ("tpot_s", target.tpot_s), ("client_e2e_s", target.e2e_s),
                ("tvt_s", target.tvt_s),
            )
            for metric, limit in limits:
                if limit is not None:
                    values = d[metric] if metric != "tvt_s" else self.columns["tvt_s"][done]
                    # A request with no TPOT (one output token) or no verify round cannot miss that target.
                    ok = (values <= limit) | np.isnan(values) if metric in ("tpot_s", "tvt_s") else values <= limit
                    met &= ~mask | ok
        return met

    def has_client_network(self) -> bool:
        """Whether some request crossed a client network (then client and server views differ)."""
        c = self.columns
        return bool((c["upload_s"] != 0).any() or (c["download_s"] != 0).any())

    def measurement(self, measured: np.ndarray) -> tuple[float, float]:
        """``(start_s, duration_s)`` of the span the whole-run rates divide by (``summary()["measurement"]``)."""
        start_s = 0.0
        if not measured.all():
            # Warm-up precedes measurement: rates count from the first measured arrival.
            start_s = float(self.columns["arrival_s"][measured].min()) if measured.any() else self.end_s
        return start_s, self.end_s - start_s

    def windowed_rates(self, measured: np.ndarray) -> tuple[WindowedRates, int]:
        """The arrival-window part of ``summary()["throughput"]`` and how many completions
        inside the window met their SLO (see "Rates and their windows" in :mod:`simpy_llm.metrics.results`)."""
        c = self.columns
        arrival = c["arrival_s"]
        if measured.any():
            a0, a1 = float(arrival[measured].min()), float(arrival[measured].max())
        else:
            a0 = a1 = self.end_s
        window_s = a1 - a0
        span = window_s if window_s > 0 else float("nan")
        completed = c["status"] == "completed"
        # Departures inside (a0, a1]: the first arrival opens the window, so it is not one of
        # its arrivals, and a request completing at a0 left before the window began.
        inside = completed & (c["completion_s"] > a0) & (c["completion_s"] <= a1)
        offered = int((measured & (arrival > a0) & (arrival <= a1)).sum())
        last_completion = float(c["completion_s"][completed].max()) if completed.any() else a1
        met = self.slo_met(inside, self.derived_over(inside))
        rates: WindowedRates = {
            "requests_per_s": int(inside.sum()) / span,
            "output_tokens_per_s": int(c["output_tokens"][inside].sum()) / span,
            "input_tokens_per_s": int(c["prompt_tokens"][inside].sum()) / span,
            "offered_requests_per_s": offered / span,
            "window_start_s": a0,
            "window_s": window_s,
            "drain_s": max(last_completion - a1, 0.0),
        }
        return rates, int(met.sum())

    def drop_counts(self) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
        """Drops per reason, and per SLO class then reason (``unknown``: a drop without a reason)."""
        c = self.columns
        dropped = c["status"] == "dropped"
        reasons = np.array([r or "unknown" for r in c["dropped_reason"][dropped].tolist()], dtype=object)
        classes = c["slo_class"][dropped]
        by_reason = {r: int((reasons == r).sum()) for r in sorted(set(reasons.tolist()))}
        by_class: dict[str, dict[str, int]] = {}
        for cls_name in sorted(set(classes.tolist())):
            in_class = reasons[classes == cls_name]
            by_class[cls_name] = {r: int((in_class == r).sum()) for r in sorted(set(in_class.tolist()))}
        return by_reason, by_class

    def latency_by(self, values: np.ndarray, done: np.ndarray) -> dict[str, ClassLatency]:
        """Latency statistics per value of *values* (aligned with the records), over the
        requests in *done*, for every value a measured request has."""
        keys = values[self.columns["warm_up"] == 0]
        names = sorted(set(keys.tolist()))
        del keys
        out: dict[str, ClassLatency] = {name: {} for name in names}  # type: ignore[typeddict-item]  # filled below, metric by metric
        groups = values[done]
        codes = np.full(groups.shape, -1, dtype=np.int32)  # each done request's group, by its index in names
        for i, name in enumerate(names):
            codes[groups == name] = i
        del groups
        for metric in ("ttft_s", "tpot_s", "e2e_s", "queue_delay_s"):
            # One metric over the done requests at a time; a group's values are its share of them.
            seen = self.metric(metric, done, client=True)
            for i, name in enumerate(names):
                out[name][metric.removesuffix("_s")] = latency_stats(seen[codes == i])  # type: ignore[literal-required]  # one of ClassLatency's keys
        return out
