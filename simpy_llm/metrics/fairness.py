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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from simpy_llm.metrics.summary import Fairness

__all__ = ["jain_index", "tenant_fairness"]


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
