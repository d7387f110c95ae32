"""Topology: the network between endpoints, and the path one message takes across it.

A :class:`Topology` holds an undirected :class:`networkx.Graph` whose edges carry
``latency_s`` (one-way propagation delay, seconds) and ``bandwidth_bytes_per_s``
(capacity, bytes/s; ``inf`` for unlimited). :meth:`Topology.path` answers, for two
endpoints, the lowest-latency path: its one-way latency (the sum of its edges'
latencies), its bottleneck bandwidth (the smallest along it) and the nodes it
visits. That is what a :class:`~simpy_llm.network.link.Link` between the two needs
(``rtt_s = 2 x latency_s``).

Three ways to build one, each also reachable from a YAML-like mapping through
:meth:`Topology.from_spec` (``{type: links | complete | clos, ...}``):

* ``links``: an explicit list of ``{src, dst, rtt_ms, bandwidth_mbps}``;
* ``complete``: every pair of endpoints linked directly, all links alike;
* ``clos``: a two-tier leaf/spine fabric (seed 003, "Topology-Aware Network
  Model"): every leaf linked to every spine, each endpoint attached to one leaf.

Units at the boundary are the ones people quote: round trips in milliseconds
(``rtt_ms``), one-way fabric hops in milliseconds (``hop_latency_ms``,
``device_edge_latency_ms``), bandwidths in megabits per second (10^6 bit/s). Inside,
seconds and bytes per second.

Which path
----------
The path between ``a`` and ``b`` is one of least latency (networkx Dijkstra with
weight ``latency_s``). Ties are broken deterministically, in this order:

1. fewest links;
2. largest bottleneck bandwidth;
3. smallest sequence of node names (compared as strings), read from the endpoint
   whose name sorts first.

Latencies are summed exactly (each float is an integer times a power of two, and
Dijkstra runs on those integers), so two paths tie exactly when their latencies add up
to the same number, whatever the order of the additions; the path's ``latency_s`` is
that exact sum rounded once. The rule is the same both ways round, so ``path(b, a)``
visits the nodes of ``path(a, b)`` in reverse and has the same latency and bandwidth,
to the bit. One shortest-path tree is built per endpoint asked about (the first
argument, unless the second's tree is already built) and kept (the most recent 1024).

Assumptions and caveats
-----------------------
* The bandwidth of a path is its narrowest link's capacity. The topology does not
  share a link among the pairs whose paths cross it: each pair's
  :class:`~simpy_llm.network.link.Link` gets the path's figures for itself.
* A path never changes: no failures, no load-dependent routing, no ECMP spreading
  of one pair's traffic over several spines.
* Switching and serialisation delays are part of the figures you give (a hop's
  latency is whatever one traversal of that link costs, one way).

Examples
--------
>>> t = Topology.clos(["a", "b", "c"], spine_count=2, leaf_count=2,
...                   hop_latency_ms=0.5, device_edge_latency_ms=0.1, edge_bandwidth_mbps=800)
>>> p = t.path("a", "b")              # a on leaf 0, b on leaf 1: edge, hop, hop, edge
>>> round(p.latency_s * 1e3, 9), p.bandwidth_bytes_per_s, p.hops
(1.2, 100000000.0, ('a', 'leaf/0', 'spine/0', 'leaf/1', 'b'))
>>> round(t.path("a", "c").rtt_s * 1e3, 9)   # a and c share leaf 0: two edge hops each way
0.4
"""

from __future__ import annotations

import math
import numbers
import reprlib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import MAX_BANDWIDTH_MBPS, MAX_REPLICAS, MAX_TIME_S

if TYPE_CHECKING:
    import networkx as nx

__all__ = [
    "MAX_COMPLETE_ENDPOINTS",
    "MAX_FABRIC_LINKS",
    "MAX_FABRIC_SWITCHES",
    "TOPOLOGY_TYPES",
    "Path",
    "Topology",
]

MAX_COMPLETE_ENDPOINTS = 2048
"""Most endpoints of a ``complete`` topology: it has n(n-1)/2 links (about 2.1 million
at 2048), each a networkx edge of a few hundred bytes."""

MAX_FABRIC_SWITCHES = 4096
"""Most spines, and most leaves, of a ``clos`` fabric (a two-tier fabric of 64-port
switches has at most 64 spines and 128 leaves; this leaves room for far larger ones)."""

MAX_FABRIC_LINKS = 2**18
"""Most leaf-to-spine links of a ``clos`` fabric (``spine_count x leaf_count``), 262,144."""

MAX_LATENCY_MS = MAX_TIME_S * 1e3
"""Largest latency or round trip, milliseconds (the simulation's longest time)."""

TOPOLOGY_TYPES = ("links", "complete", "clos")
"""The ``type`` values :meth:`Topology.from_spec` accepts."""

_SPEC_KEYS = {
    "links": ("type", "links"),
    "complete": ("type", "endpoints", "rtt_ms", "bandwidth_mbps"),
    "clos": (
        "type", "endpoints", "spine_count", "leaf_count", "hop_latency_ms", "device_edge_latency_ms",
        "spine_bandwidth_mbps", "edge_bandwidth_mbps", "attach",
    ),
}
_REQUIRED_KEYS = {
    "links": ("links",),
    "complete": ("endpoints", "rtt_ms"),
    "clos": ("endpoints", "spine_count", "leaf_count", "hop_latency_ms", "device_edge_latency_ms"),
}
_LINK_KEYS = ("src", "dst", "rtt_ms", "bandwidth_mbps")

_SOURCE_CACHE_SIZE = 1024
"""Shortest-path trees kept per topology (one per source endpoint asked about)."""


@attrs.frozen(kw_only=True)
class Path:
    """The path one message takes between two endpoints.

    Examples
    --------
    >>> p = Path(latency_s=0.002, bandwidth_bytes_per_s=1e9, hops=("a", "s", "b"))
    >>> p.rtt_s, p.links
    (0.004, 2)
    """

    latency_s: float
    """One-way latency, seconds: the sum of the edges' one-way latencies along the path."""
    bandwidth_bytes_per_s: float
    """Bottleneck bandwidth, bytes/s: the smallest edge bandwidth along the path (``inf``
    when every edge is unlimited, and for the path from an endpoint to itself)."""
    hops: tuple[str, ...]
    """The nodes visited, from the first endpoint to the second, both included
    (``(a,)`` for the path from ``a`` to itself)."""

    @property
    def rtt_s(self) -> float:
        """Round trip, seconds: ``2 x latency_s`` (the path is the same both ways)."""
        return 2 * self.latency_s

    @property
    def links(self) -> int:
        """Links crossed: ``len(hops) - 1``."""
        return len(self.hops) - 1


@attrs.frozen
class _Tree:
    """Least-latency paths from one source: distances (latency units), fewest-link
    predecessors with their edges' bandwidths, widths."""

    dist: dict[str, int]
    preds: dict[str, list[tuple[str, float]]]
    width: dict[str, float]


class Topology:
    """An undirected network: endpoints, the switches between them, and their links.

    Parameters
    ----------
    graph
        An undirected :class:`networkx.Graph` with string node names; every edge has
        ``latency_s`` (one-way, seconds, finite and >= 0) and
        ``bandwidth_bytes_per_s`` (> 0, ``inf`` for unlimited). It is copied and
        frozen, so later changes to *graph* do not affect the topology.
    endpoints
        The nodes :meth:`path` may be asked about (default: every node). Fabric
        nodes (switches) are left out of it by the constructors.

    Raises
    ------
    ValueError
        For a directed or multi-graph, a node name that is not a string, an
        endpoint that is not a node, a self-loop, or an edge whose figures are
        missing or out of range; the message names the edge and the attribute.

    Examples
    --------
    >>> import networkx as nx
    >>> g = nx.Graph()
    >>> g.add_edge("a", "b", latency_s=0.001, bandwidth_bytes_per_s=1e9)
    >>> Topology(g).path("b", "a")
    Path(latency_s=0.001, bandwidth_bytes_per_s=1000000000.0, hops=('b', 'a'))
    """

    def __init__(self, graph: nx.Graph, endpoints: Iterable[str] | None = None) -> None:
        import networkx as nx  # loaded when a topology is built: networkx takes ~0.2 s to import

        if not isinstance(graph, nx.Graph) or graph.is_directed() or graph.is_multigraph():
            raise ValueError(f"graph must be an undirected networkx.Graph (not a multigraph), got {type(graph).__name__}")
        for node in graph.nodes:
            if not isinstance(node, str) or not node:
                raise ValueError(f"node names must be non-empty strings, got {node!r}")
        for u, v, data in graph.edges(data=True):
            if u == v:
                raise ValueError(f"edge {u!r}-{v!r}: a node cannot link to itself")
            latency = data.get("latency_s")
            if not _is_real(latency) or not 0 <= latency <= MAX_TIME_S:
                raise ValueError(f"edge {u!r}-{v!r}: latency_s must be a number in [0, {MAX_TIME_S}], got {latency!r}")
            bandwidth = data.get("bandwidth_bytes_per_s")
            if not _is_real(bandwidth) or math.isnan(bandwidth) or not bandwidth > 0:
                raise ValueError(
                    f"edge {u!r}-{v!r}: bandwidth_bytes_per_s must be a number > 0 (inf for unlimited), got {bandwidth!r}"
                )
        names = tuple(graph.nodes) if endpoints is None else tuple(endpoints)
        missing = [e for e in names if e not in graph]
        if missing:
            raise ValueError(f"endpoints not in the graph: {', '.join(map(repr, missing))}")
        if len(set(names)) != len(names):
            raise ValueError("endpoints must not repeat")
        frozen = nx.Graph(graph)
        self._graph: nx.Graph = nx.freeze(frozen)
        # Latencies as exact integers (a float is an integer times a power of two), so
        # sums are exact: ties are exact, and the same both ways round.
        ratios = {lat: lat.as_integer_ratio() for lat in {float(d) for *_, d in frozen.edges(data="latency_s")}}
        self._scale: int = max((den for _num, den in ratios.values()), default=1)
        self._units: dict[float, int] = {lat: num * (self._scale // den) for lat, (num, den) in ratios.items()}
        self._endpoints: tuple[str, ...] = names
        self._endpoint_set = frozenset(names)
        self._trees: dict[str, _Tree] = {}

    def __repr__(self) -> str:
        return (
            f"Topology({len(self._endpoints)} endpoints, {self._graph.number_of_nodes()} nodes, "
            f"{self._graph.number_of_edges()} links)"
        )

    @property
    def graph(self) -> nx.Graph:
        """The graph: edges carry ``latency_s`` and ``bandwidth_bytes_per_s``.

        Frozen against adding or removing nodes and edges; its attribute dicts must not
        be edited either (paths already computed would not follow).
        """
        return self._graph

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The endpoints, in the order given."""
        return self._endpoints

    # --- paths ------------------------------------------------------------------------

    def path(self, a: str, b: str) -> Path:
        """The least-latency path from endpoint *a* to endpoint *b* (ties: module docstring).

        Parameters
        ----------
        a, b
            Endpoint names.

        Returns
        -------
        Path
            Its one-way latency (s), bottleneck bandwidth (bytes/s) and nodes. The
            path from an endpoint to itself has zero latency, infinite bandwidth and
            one node.

        Raises
        ------
        ValueError
            When *a* or *b* is not an endpoint (the message names each unknown one),
            or when no path joins them.

        Examples
        --------
        >>> t = Topology.complete(["x", "y"], rtt_ms=2.0, bandwidth_mbps=80)
        >>> t.path("x", "y")
        Path(latency_s=0.001, bandwidth_bytes_per_s=10000000.0, hops=('x', 'y'))
        >>> t.path("x", "x")
        Path(latency_s=0.0, bandwidth_bytes_per_s=inf, hops=('x',))
        >>> t.path("x", "z")
        Traceback (most recent call last):
        ...
        ValueError: unknown endpoint 'z'; endpoints: 'x', 'y'
        """
        unknown = [e for e in dict.fromkeys((a, b)) if not _hashable(e) or e not in self._endpoint_set]
        if unknown:
            known = _listing(self._endpoints)
            plural = "s" if len(unknown) > 1 else ""
            raise ValueError(f"unknown endpoint{plural} {', '.join(map(repr, unknown))}; endpoints: {known}")
        if a == b:
            return Path(latency_s=0.0, bandwidth_bytes_per_s=math.inf, hops=(a,))
        # Either endpoint's tree gives the same answer (sums are exact, the tie rule is
        # symmetric): reuse one already built, else build a's.
        root, other = (b, a) if a not in self._trees and b in self._trees else (a, b)
        tree = self._tree(root)
        if other not in tree.dist:
            raise ValueError(f"no path between endpoints {a!r} and {b!r}")
        if root <= other:
            hops = self._forward(tree, root, other)
        else:
            hops = self._backward(tree, root, other)
        return Path(
            latency_s=tree.dist[other] / self._scale,
            bandwidth_bytes_per_s=float(tree.width[other]),
            hops=hops if root == a else hops[::-1],
        )

    def _tree(self, source: str) -> _Tree:
        """*source*'s tree, built once (the oldest is dropped past ``_SOURCE_CACHE_SIZE``)."""
        tree = self._trees.get(source)
        if tree is None:
            if len(self._trees) >= _SOURCE_CACHE_SIZE:
                del self._trees[next(iter(self._trees))]
            tree = self._trees[source] = self._build_tree(source)
        return tree

    def _build_tree(self, source: str) -> _Tree:
        """Least-latency distances from *source* (exact, in latency units); the DAG of
        least-latency, fewest-link predecessors (each with its edge's bandwidth); and each
        node's largest bottleneck over that DAG."""
        import networkx as nx  # loaded when a topology is built: networkx takes ~0.2 s to import

        units = self._units
        dist = nx.single_source_dijkstra_path_length(
            self._graph, source, weight=lambda _u, _v, data: units[data["latency_s"]]
        )
        # Breadth-first over the tight edges (those on some least-latency path): the
        # first visit gives the fewest links; predecessors one level up are kept.
        links = {source: 0}
        preds: dict[str, list[tuple[str, float]]] = {source: []}
        order = [source]
        adj = self._graph.adj
        i = 0
        while i < len(order):
            u = order[i]
            i += 1
            du, level = dist[u], links[u] + 1
            for v, data in adj[u].items():
                if du + units[data["latency_s"]] != dist[v]:
                    continue
                seen = links.get(v)
                if seen is None:
                    links[v] = level
                    preds[v] = [(u, data["bandwidth_bytes_per_s"])]
                    order.append(v)
                elif seen == level:
                    preds[v].append((u, data["bandwidth_bytes_per_s"]))
        width = {source: math.inf}
        for v in order[1:]:  # breadth-first order is a topological order of the DAG
            width[v] = max(min(width[u], bw) for u, bw in preds[v])
        return _Tree(dist=dist, preds=preds, width=width)

    @staticmethod
    def _forward(tree: _Tree, root: str, target: str) -> tuple[str, ...]:
        """The widest DAG path from *root* to *target* whose names, read from *root*, are smallest."""
        need = tree.width[target]
        succ: dict[str, list[str]] = {}
        seen = {target}
        stack = [target]
        while stack:  # every node on a path of width `need` to target, and its usable successors
            v = stack.pop()
            for u, bw in tree.preds[v]:
                if bw >= need and tree.width[u] >= need:
                    succ.setdefault(u, []).append(v)
                    if u not in seen:
                        seen.add(u)
                        stack.append(u)
        hops = [root]
        while hops[-1] != target:
            hops.append(min(succ[hops[-1]]))
        return tuple(hops)

    @staticmethod
    def _backward(tree: _Tree, root: str, target: str) -> tuple[str, ...]:
        """The widest DAG path from *root* to *target* whose names, read from *target*, are smallest."""
        need = tree.width[target]
        back = [target]
        while back[-1] != root:  # a predecessor that keeps the width also reaches root with it
            back.append(min(u for u, bw in tree.preds[back[-1]] if bw >= need and tree.width[u] >= need))
        return tuple(reversed(back))

    # --- constructors -------------------------------------------------------------------

    @classmethod
    def from_links(cls, links: Sequence[Mapping[str, Any]]) -> Topology:
        """A topology of explicit links; every node is an endpoint.

        Parameters
        ----------
        links
            Mappings ``{src, dst, rtt_ms, bandwidth_mbps}``: two node names, the round
            trip over the link in milliseconds (``latency_s = rtt_ms / 2 / 1000``), and
            optionally its bandwidth in megabits per second (``bytes/s = mbps x 1e6 /
            8``; left out or null: unlimited). A pair may be linked once (either way
            round).

        Raises
        ------
        FieldValueError
            Naming the key path (``links[2].rtt_ms``) and what is allowed.

        Examples
        --------
        >>> t = Topology.from_links([
        ...     {"src": "a", "dst": "b", "rtt_ms": 10},
        ...     {"src": "b", "dst": "c", "rtt_ms": 2, "bandwidth_mbps": 8},
        ... ])
        >>> t.path("a", "c")
        Path(latency_s=0.006, bandwidth_bytes_per_s=1000000.0, hops=('a', 'b', 'c'))
        >>> Topology.from_links([{"src": "a", "dst": "b", "rtt": 1}])
        Traceback (most recent call last):
        ...
        simpy_llm.config.errors.FieldValueError: links[0].rtt: unknown key; allowed: src, dst, rtt_ms, bandwidth_mbps
        """
        import networkx as nx  # loaded when a topology is built: networkx takes ~0.2 s to import

        if isinstance(links, (str, bytes, Mapping)) or not isinstance(links, Sequence):
            raise FieldValueError("links", f"must be a list of {{src, dst, rtt_ms, bandwidth_mbps}}, got {reprlib.repr(links)}")
        if not links:
            raise FieldValueError("links", "must list at least one link")
        graph = nx.Graph()
        for i, link in enumerate(links):
            where = f"links[{i}]"
            if not isinstance(link, Mapping):
                raise FieldValueError(where, f"must be a mapping with keys {', '.join(_LINK_KEYS)}, got {reprlib.repr(link)}")
            _check_keys(link, _LINK_KEYS, ("src", "dst", "rtt_ms"), prefix=f"{where}.")
            src = _name(link["src"], f"{where}.src")
            dst = _name(link["dst"], f"{where}.dst")
            if src == dst:
                raise FieldValueError(f"{where}.dst", f"a link joins two different nodes; got {src!r} at both ends")
            if graph.has_edge(src, dst):
                raise FieldValueError(where, f"duplicate link between {src!r} and {dst!r} (links are undirected)")
            rtt_ms = _number(link["rtt_ms"], f"{where}.rtt_ms", 0, MAX_LATENCY_MS)
            bandwidth = _bandwidth(link.get("bandwidth_mbps"), f"{where}.bandwidth_mbps")
            graph.add_edge(src, dst, latency_s=rtt_ms / 2 / 1e3, bandwidth_bytes_per_s=bandwidth)
        return cls(graph)

    @classmethod
    def complete(cls, endpoints: Sequence[str], rtt_ms: float, bandwidth_mbps: float | None = None) -> Topology:
        """Every pair of *endpoints* linked directly, with one round trip and bandwidth.

        Parameters
        ----------
        endpoints
            Distinct endpoint names (at most :data:`MAX_COMPLETE_ENDPOINTS`).
        rtt_ms
            Round trip of every link, milliseconds.
        bandwidth_mbps
            Bandwidth of every link, megabits per second (None: unlimited).

        Raises
        ------
        FieldValueError
            Naming the argument (``endpoints``, ``rtt_ms``, ``bandwidth_mbps``).

        Examples
        --------
        >>> t = Topology.complete(["a", "b", "c"], rtt_ms=0.2)
        >>> t.path("c", "a")
        Path(latency_s=0.0001, bandwidth_bytes_per_s=inf, hops=('c', 'a'))
        """
        import networkx as nx  # loaded when a topology is built: networkx takes ~0.2 s to import

        names = _endpoint_names(endpoints)
        if len(names) > MAX_COMPLETE_ENDPOINTS:
            raise FieldValueError(
                "endpoints", f"a complete topology takes at most {MAX_COMPLETE_ENDPOINTS} endpoints, got {len(names)}"
            )
        latency_s = _number(rtt_ms, "rtt_ms", 0, MAX_LATENCY_MS) / 2 / 1e3
        bandwidth = _bandwidth(bandwidth_mbps, "bandwidth_mbps")
        graph = nx.Graph()
        graph.add_nodes_from(names)
        for i, u in enumerate(names):
            for v in names[i + 1 :]:
                graph.add_edge(u, v, latency_s=latency_s, bandwidth_bytes_per_s=bandwidth)
        return cls(graph, names)

    @classmethod
    def clos(
        cls,
        endpoints: Sequence[str],
        *,
        spine_count: int,
        leaf_count: int,
        hop_latency_ms: float,
        device_edge_latency_ms: float,
        spine_bandwidth_mbps: float | None = None,
        edge_bandwidth_mbps: float | None = None,
        attach: Mapping[str, int] | None = None,
    ) -> Topology:
        """A two-tier leaf/spine fabric: every leaf linked to every spine, each endpoint to one leaf.

        Fabric nodes are named ``spine/<i>`` and ``leaf/<j>`` (from 0). Two endpoints
        on one leaf are two edge links apart (``2 x device_edge_latency_ms``); on
        different leaves, endpoint-leaf-spine-leaf-endpoint (``2 x
        device_edge_latency_ms + 2 x hop_latency_ms``), through ``spine/0`` by the tie
        rule when the spines are alike.

        Parameters
        ----------
        endpoints
            Distinct endpoint names, none equal to a fabric node's name.
        spine_count, leaf_count
            Spines and leaves (each in [1, :data:`MAX_FABRIC_SWITCHES`], their product
            at most :data:`MAX_FABRIC_LINKS`).
        hop_latency_ms
            One-way latency of a leaf-spine link, milliseconds.
        device_edge_latency_ms
            One-way latency of an endpoint-leaf link, milliseconds.
        spine_bandwidth_mbps, edge_bandwidth_mbps
            Bandwidth of each leaf-spine and each endpoint-leaf link, megabits per
            second (None: unlimited).
        attach
            Endpoint name -> leaf index (0 to ``leaf_count - 1``), naming every
            endpoint; None: round robin over the leaves in the order of *endpoints*
            (the i-th endpoint on leaf ``i mod leaf_count``).

        Raises
        ------
        FieldValueError
            Naming the argument (``spine_count``, ``attach.<endpoint>``, ...) and what
            is allowed.

        Examples
        --------
        >>> t = Topology.clos(["a", "b"], spine_count=1, leaf_count=1, hop_latency_ms=1, device_edge_latency_ms=0.25)
        >>> t.path("a", "b").hops, t.path("a", "b").latency_s
        (('a', 'leaf/0', 'b'), 0.0005)
        >>> Topology.clos(["a", "b"], spine_count=1, leaf_count=2, hop_latency_ms=1,
        ...               device_edge_latency_ms=1, attach={"a": 0, "b": 2})
        Traceback (most recent call last):
        ...
        simpy_llm.config.errors.FieldValueError: attach.b: must be a leaf index in [0, 1], got 2
        """
        import networkx as nx  # loaded when a topology is built: networkx takes ~0.2 s to import

        names = _endpoint_names(endpoints)
        spines = _count(spine_count, "spine_count", MAX_FABRIC_SWITCHES)
        leaves = _count(leaf_count, "leaf_count", MAX_FABRIC_SWITCHES)
        if spines * leaves > MAX_FABRIC_LINKS:
            raise FieldValueError(
                "leaf_count",
                f"spine_count x leaf_count must be <= {MAX_FABRIC_LINKS} leaf-spine links, got {spines} x {leaves}",
            )
        hop_s = _number(hop_latency_ms, "hop_latency_ms", 0, MAX_LATENCY_MS) / 1e3
        edge_s = _number(device_edge_latency_ms, "device_edge_latency_ms", 0, MAX_LATENCY_MS) / 1e3
        spine_bw = _bandwidth(spine_bandwidth_mbps, "spine_bandwidth_mbps")
        edge_bw = _bandwidth(edge_bandwidth_mbps, "edge_bandwidth_mbps")
        spine_names = [f"spine/{i}" for i in range(spines)]
        leaf_names = [f"leaf/{j}" for j in range(leaves)]
        fabric = set(spine_names) | set(leaf_names)
        for i, name in enumerate(names):
            if name in fabric:
                raise FieldValueError(
                    f"endpoints[{i}]",
                    f"{name!r} is the name of a fabric node; fabric nodes are named spine/<i> and leaf/<j>, "
                    "so endpoints must use other names",
                )
        placed = _attachments(attach, names, leaves)
        graph = nx.Graph()
        graph.add_nodes_from(names, kind="endpoint")
        graph.add_nodes_from(spine_names, kind="spine")
        graph.add_nodes_from(leaf_names, kind="leaf")
        for leaf in leaf_names:
            for spine in spine_names:
                graph.add_edge(leaf, spine, latency_s=hop_s, bandwidth_bytes_per_s=spine_bw)
        for name in names:
            graph.add_edge(name, leaf_names[placed[name]], latency_s=edge_s, bandwidth_bytes_per_s=edge_bw)
        return cls(graph, names)

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Topology:
        """A topology from a YAML-like mapping ``{type: links | complete | clos, ...}``.

        The keys beside ``type`` are the arguments of :meth:`from_links` (``links``),
        :meth:`complete` (``endpoints``, ``rtt_ms``, ``bandwidth_mbps``) or
        :meth:`clos` (``endpoints``, ``spine_count``, ``leaf_count``,
        ``hop_latency_ms``, ``device_edge_latency_ms``, ``spine_bandwidth_mbps``,
        ``edge_bandwidth_mbps``, ``attach``). Values are taken as YAML gives them: a
        count must be an integer, a figure a number (not a boolean or a string).

        Raises
        ------
        FieldValueError
            For an unknown ``type``, a missing or unknown key, or a bad value; its
            ``field`` is the key path relative to *spec* (``links[1].rtt_ms``,
            ``attach.decode/0``), so a loader can prefix it with the spec's own.

        Examples
        --------
        >>> t = Topology.from_spec({"type": "complete", "endpoints": ["p", "d"], "rtt_ms": 0.02})
        >>> t.path("p", "d").rtt_s
        2e-05
        >>> Topology.from_spec({"type": "mesh"})
        Traceback (most recent call last):
        ...
        simpy_llm.config.errors.FieldValueError: type: unknown topology type 'mesh'; one of: links, complete, clos
        """
        if not isinstance(spec, Mapping):
            raise FieldValueError("", f"a topology must be a mapping with key 'type', got {reprlib.repr(spec)}")
        if "type" not in spec:
            raise FieldValueError("type", f"required key is missing; one of: {', '.join(TOPOLOGY_TYPES)}")
        kind = spec["type"]
        if not isinstance(kind, str) or kind not in TOPOLOGY_TYPES:
            raise FieldValueError("type", f"unknown topology type {kind!r}; one of: {', '.join(TOPOLOGY_TYPES)}")
        _check_keys(spec, _SPEC_KEYS[kind], _REQUIRED_KEYS[kind])
        args = {k: v for k, v in spec.items() if k != "type"}
        if kind == "links":
            return cls.from_links(args["links"])
        if kind == "complete":
            return cls.complete(**args)
        endpoints = args.pop("endpoints")
        return cls.clos(endpoints, **args)


# --- validation helpers -------------------------------------------------------------------


def _listing(names: Sequence[str], most: int = 10) -> str:
    """``'a', 'b', ... (N in all)``: the first *most* names, quoted."""
    shown = ", ".join(map(repr, names[:most]))
    return shown if len(names) <= most else f"{shown}, ... ({len(names)} in all)"


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_keys(mapping: Mapping[Any, Any], allowed: Sequence[str], required: Sequence[str], prefix: str = "") -> None:
    for key in mapping:
        if key not in allowed:
            raise FieldValueError(f"{prefix}{key}", f"unknown key; allowed: {', '.join(allowed)}")
    for key in required:
        if key not in mapping:
            raise FieldValueError(f"{prefix}{key}", "required key is missing")


def _number(value: Any, key: str, low: float, high: float) -> float:
    if not _is_real(value):
        raise FieldValueError(key, f"must be a number, got {reprlib.repr(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        number = math.inf
    if not math.isfinite(number):
        raise FieldValueError(key, f"must be a finite number, got {reprlib.repr(value)}")
    if not low <= number <= high:
        raise FieldValueError(key, f"must be in [{low}, {high}], got {reprlib.repr(value)}")
    return number


def _bandwidth(mbps: Any, key: str) -> float:
    """Megabits/s (None: unlimited) -> bytes/s."""
    if mbps is None:
        return math.inf
    value = _number(mbps, key, 0, MAX_BANDWIDTH_MBPS)
    if value == 0:
        raise FieldValueError(key, f"must be > 0 megabits/s (leave it out for unlimited), got {mbps!r}")
    return value * 1e6 / 8


def _count(value: Any, key: str, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldValueError(key, f"must be an integer, got {reprlib.repr(value)}")
    if not 1 <= value <= high:
        raise FieldValueError(key, f"must be in [1, {high}], got {reprlib.repr(value)}")
    return value


def _name(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise FieldValueError(key, f"must be a non-empty string (a node name), got {reprlib.repr(value)}")
    return value


def _endpoint_names(endpoints: Any) -> list[str]:
    if isinstance(endpoints, (str, bytes, Mapping)) or not isinstance(endpoints, Sequence):
        raise FieldValueError("endpoints", f"must be a list of endpoint names, got {reprlib.repr(endpoints)}")
    if not endpoints:
        raise FieldValueError("endpoints", "must name at least one endpoint")
    if len(endpoints) > MAX_REPLICAS:
        raise FieldValueError("endpoints", f"must name at most {MAX_REPLICAS} endpoints, got {len(endpoints)}")
    names: list[str] = []
    seen: set[str] = set()
    for i, value in enumerate(endpoints):
        name = _name(value, f"endpoints[{i}]")
        if name in seen:
            raise FieldValueError(f"endpoints[{i}]", f"duplicate endpoint {name!r}")
        seen.add(name)
        names.append(name)
    return names


def _attachments(attach: Any, names: list[str], leaves: int) -> dict[str, int]:
    """Each endpoint's leaf index: *attach* (which must place every endpoint) or round robin."""
    if attach is None:
        return {name: i % leaves for i, name in enumerate(names)}
    if not isinstance(attach, Mapping):
        raise FieldValueError("attach", f"must be a mapping of endpoint names to leaf indices, got {reprlib.repr(attach)}")
    known = set(names)
    placed: dict[str, int] = {}
    for key, leaf in attach.items():
        if key not in known:
            raise FieldValueError(f"attach.{key}", f"not an endpoint; endpoints: {_listing(names)}")
        if isinstance(leaf, bool) or not isinstance(leaf, int) or not 0 <= leaf < leaves:
            raise FieldValueError(f"attach.{key}", f"must be a leaf index in [0, {leaves - 1}], got {reprlib.repr(leaf)}")
        placed[key] = leaf
    missing = [name for name in names if name not in placed]
    if missing:
        raise FieldValueError(
            "attach",
            f"must place every endpoint (or be left out for round robin); missing: {_listing(missing)}",
        )
    return placed
