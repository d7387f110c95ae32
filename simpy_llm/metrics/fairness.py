"""Fairness across tenants: Jain's index and the per-tenant quantities it is taken over.

Jain's fairness index of *n* non-negative allocations x_1..x_n is

    J = (sum x)^2 / (n * sum x^2)

It is 1 when every tenant gets the same, 1/n when one tenant gets everything and
the others nothing, and does not change when every x is scaled by the same factor.

Two allocations are reported per run (see :meth:`Results.summary`):

* ``completed_share``: the share of a tenant's requests (warm-up excluded) that
  completed within the run. A tenant whose requests are dropped or left in flight
  gets less.
* ``inverse_normalized_e2e``: 1 / (mean over the tenant's completed requests of
  e2e_s / output_tokens), the reciprocal of the "normalized latency" of the Orca and
  vLLM papers. Dividing by the output length keeps tenants with long answers from
  looking treated worse merely for asking more. Tenants with no completed request
  have no value and are left out of this index (the first index already shows them),
  as are tenants whose mean is 0 (zero-latency service, an infinite allocation).

**Cohorts** (``metrics.fairness.cohorts``, seed 003 §5.5 "Fairness classes"): the measured
requests grouped by a key of their records (client, tenant, SLO class, draft group or
device, replica group, cluster, or bins of the prompt or output length). Per group
:func:`cohort_fairness` reports the requests, completions, SLO-meeting completions, the
completed share and the SLO attainment ``met / completed`` (the goodput fraction of the
group), and over the groups the attainment gap (highest minus lowest) and Jain's index of
attainment.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from simpy_llm.metrics.summary import CohortFairness, CohortGroup, Fairness

__all__ = ["bin_labels", "cohort_fairness", "jain_index", "tenant_fairness"]


def jain_index(values: Sequence[float] | np.ndarray) -> float | None:
    """Jain's fairness index of non-negative *values*.

    Returns 1.0 for a single value (one tenant is trivially treated fairly), and
    ``None`` when there are no values or every value is 0 (the index is 0/0).

    Examples
    --------
    >>> jain_index([1.0, 1.0, 1.0])
    1.0
    >>> jain_index([1.0, 0.0, 0.0, 0.0])  # one of four gets everything: 1/n
    0.25
    >>> jain_index([1.0, 0.5])  # (1.5)^2 / (2 * 1.25)
    0.9
    >>> jain_index([0.0]), jain_index([]), jain_index([0.0, 0.0])
    (1.0, None, None)
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return None
    if x.size == 1:
        return 1.0
    if np.any(x < 0) or np.any(np.isnan(x)):
        raise ValueError(f"Jain's index needs non-negative numbers, got {x.tolist()}")
    square_sum = float(np.dot(x, x))
    if square_sum == 0.0:
        return None
    return float(x.sum() ** 2 / (x.size * square_sum))


def tenant_fairness(
    tenant: np.ndarray,
    completed: np.ndarray,
    e2e_s: np.ndarray,
    output_tokens: np.ndarray,
) -> Fairness:
    """Both fairness indexes over the tenants of the given requests (see the module docstring).

    Parameters
    ----------
    tenant
        Tenant id per request (the requests to judge: warm-up already removed).
    completed
        Whether each request completed.
    e2e_s, output_tokens
        Per-request end-to-end latency (read for completed requests only) and output length.

    Returns
    -------
    Fairness
        ``{"tenants": n, "completed_share": {"jain", "by_tenant"},
        "inverse_normalized_e2e": {"jain", "by_tenant"}}``; tenants sorted by name.

    Examples
    --------
    >>> t = np.array(["a", "a", "b", "b"], dtype=object)
    >>> done = np.array([True, True, True, False])
    >>> out = tenant_fairness(t, done, np.array([1.0, 3.0, 2.0, np.nan]), np.array([1, 1, 1, 1]))
    >>> out["completed_share"]["by_tenant"], round(out["completed_share"]["jain"], 4)  # x = 1, 0.5
    ({'a': 1.0, 'b': 0.5}, 0.9)
    >>> out["inverse_normalized_e2e"]["by_tenant"]  # 1 / mean(1, 3) and 1 / 2
    {'a': 0.5, 'b': 0.5}
    """
    share: dict[str, float] = {}
    inverse: dict[str, float] = {}
    for name in sorted(set(tenant.tolist())):
        mask = tenant == name
        done = mask & completed
        share[name] = float(done.sum() / mask.sum())
        if done.any():
            # A zero-length output would divide by zero; it costs at least one token's time.
            normalized = e2e_s[done] / np.maximum(output_tokens[done], 1)
            mean = float(normalized.mean())
            if mean > 0:
                inverse[name] = 1.0 / mean
    return {
        "tenants": len(share),
        "completed_share": {"jain": jain_index(list(share.values())), "by_tenant": share},
        "inverse_normalized_e2e": {"jain": jain_index(list(inverse.values())), "by_tenant": inverse},
    }


def bin_labels(values: np.ndarray, edges: Sequence[int]) -> tuple[np.ndarray, list[str]]:
    """Each of *values* (token counts) labelled by its bin of *edges* ``e_0 < ... < e_k``:
    ``"e_i-(e_{i+1} - 1)"``, ``"e_k+"`` past the last edge, ``"<e_0"`` below the first. Also
    returns every label in edge order.

    Examples
    --------
    >>> labels, order = bin_labels(np.array([100, 512, 2047, 5000]), [0, 512, 2048])
    >>> labels.tolist(), order
    (['0-511', '512-2047', '512-2047', '2048+'], ['<0', '0-511', '512-2047', '2048+'])
    """
    names = [f"<{edges[0]}"] + [f"{a}-{b - 1}" for a, b in itertools.pairwise(edges)] + [f"{edges[-1]}+"]
    index = np.searchsorted(np.asarray(edges), np.asarray(values), side="right")
    return np.array(names, dtype=object)[index], names


def cohort_fairness(
    by: str, labels: np.ndarray, completed: np.ndarray, met: np.ndarray, *, with_slo: bool, order: Sequence[str] | None = None
) -> CohortFairness:
    """SLO attainment per group of one cohort, and its gap (see the module docstring).

    Parameters
    ----------
    by
        The key grouped by (reported as given).
    labels
        Each measured request's group.
    completed
        Whether each completed.
    met
        Whether each completed and met every target of its SLO class.
    with_slo
        Whether the scenario has SLOs (without, attainment is ``None``).
    order
        The groups' order in the report (default: sorted); groups without requests are left out.

    Examples
    --------
    >>> labels = np.array(["a", "a", "b", "b", "b"], dtype=object)
    >>> done = np.array([True, True, True, True, False])
    >>> met = np.array([True, False, True, True, False])
    >>> out = cohort_fairness("client", labels, done, met, with_slo=True)
    >>> out["groups"]["a"]["slo_attainment"], out["groups"]["b"]["slo_attainment"], out["attainment_gap"]
    (0.5, 1.0, 0.5)
    >>> round(out["groups"]["b"]["completed_share"], 4), round(out["attainment_jain"], 4)
    (0.6667, 0.9)
    """
    groups: dict[str, CohortGroup] = {}
    present = set(labels.tolist())
    for name in order if order is not None else sorted(present):
        if name not in present:
            continue
        mask = labels == name
        n, done, good = int(mask.sum()), int((mask & completed).sum()), int((mask & met).sum())
        groups[name] = {
            "requests": n,
            "completed": done,
            "met": good,
            "completed_share": done / n,
            "slo_attainment": good / done if with_slo and done else None,
        }
    attainment = [g["slo_attainment"] for g in groups.values() if g["slo_attainment"] is not None]
    return {
        "by": by,
        "groups": groups,
        "attainment_gap": max(attainment) - min(attainment) if attainment else None,
        "attainment_jain": jain_index(attainment) if attainment else None,
    }
