"""The names a draft group may bind to: replicas, replica groups and clusters of the fleet.

A draft group's ``targets``, and the keys of its ``rtt_ms_by_target`` and of its drafters'
``acceptance_by_target``, name targets (``docs/speculative.md``, "Draft groups bound to
targets"): a replica (``<group>/<k>``, as :meth:`~simpy_llm.config.serving.ServingConfig.replica_names`
names it), a replica group (all its replicas) or a cluster (all the replicas of its groups).
For a per-target setting the most specific name of a replica wins: its own name, then its
group's, then its cluster's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from simpy_llm.config.serving import ServingConfig

__all__ = ["FleetTargets"]

T = TypeVar("T")


class FleetTargets:
    """The fleet's replicas by the names a draft group may give them.

    Parameters
    ----------
    serving
        The scenario's ``serving`` section.

    Examples
    --------
    >>> from simpy_llm.config.common import PolicySpec
    >>> from simpy_llm.config.serving import ReplicaGroupConfig, ServingConfig
    >>> blis = PolicySpec(kind="blis_linear")
    >>> serving = ServingConfig(replica_groups=(ReplicaGroupConfig(name="a100", count=2, latency_model=blis),
    ...                                         ReplicaGroupConfig(name="h100", latency_model=blis)))
    >>> fleet = FleetTargets(serving)
    >>> fleet.indices("a100"), fleet.indices("h100/0"), fleet.indices("gpu")
    ((0, 1), (2,), ())
    >>> fleet.per_replica({"a100": 40.0, "a100/1": 5.0})
    [40.0, 5.0, None]
    """

    def __init__(self, serving: ServingConfig) -> None:
        cluster_of = serving.cluster_of()
        self.replicas: tuple[str, ...] = tuple(serving.replica_names())
        """Each replica's name, in fleet order."""
        self.groups: tuple[str, ...] = tuple(g.name for g in serving.groups() for _ in range(g.count))
        """Each replica's group, in fleet order."""
        self.clusters: tuple[str, ...] = tuple(cluster_of.get(g, "") for g in self.groups)
        """Each replica's cluster, in fleet order ("" without clusters)."""
        self.cluster_names: tuple[str, ...] = tuple(c.name for c in serving.clusters)
        """The clusters, in the order the cluster router sees them."""

    def known(self) -> tuple[str, ...]:
        """Every name a target may be given by, replica groups first, then clusters and replicas."""
        names = dict.fromkeys((*self.groups, *self.cluster_names, *self.replicas))
        return tuple(names)

    def indices(self, name: str) -> tuple[int, ...]:
        """Fleet indices of the replicas *name* covers (empty for an unknown name)."""
        return tuple(i for i in range(len(self.replicas)) if name in (self.replicas[i], self.groups[i], self.clusters[i]))

    def allowed(self, names: Iterable[str]) -> frozenset[int]:
        """Fleet indices of the replicas any of *names* covers."""
        return frozenset(i for name in names for i in self.indices(name))

    def per_replica(self, mapping: Mapping[str, T]) -> list[T | None]:
        """Each replica's value in *mapping*, by its most specific name (replica, group, cluster);
        None where no name of it is a key."""
        out: list[T | None] = []
        for replica, group, cluster in zip(self.replicas, self.groups, self.clusters, strict=True):
            if replica in mapping:
                out.append(mapping[replica])
            elif group in mapping:
                out.append(mapping[group])
            elif cluster and cluster in mapping:
                out.append(mapping[cluster])
            else:
                out.append(None)
        return out

    def unknown_message(self, name: str) -> str:
        """Why *name* is refused: it names no target, and what the fleet's names are."""
        shown = ", ".join(self.known()[:12])
        more = " ..." if len(self.known()) > 12 else ""
        return f"unknown target {name!r}; a replica group, a cluster or a replica (<group>/<k>) of serving: {shown}{more}"
