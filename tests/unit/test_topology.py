"""Topology paths: latencies and bottlenecks against hand counts, the tie rule, and errors.

Expected figures are counted by hand from the links given (``rtt_ms / 2`` one way per
link; megabits/s x 1e6 / 8 for bytes/s), independently of the code. Sums of a few
millisecond figures converted to seconds differ from the hand count only by float
rounding, hence ``rel=1e-12``.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm.config.errors import FieldValueError
from simpy_llm.network.topology import Path, Topology

EXACT = 1e-12
"""Relative tolerance: a few float roundings of millisecond-to-second conversions."""


def _mbps(x: float) -> float:
    return x * 1e6 / 8


def _four_nodes() -> Topology:
    """a-d direct is one link of 5 ms one way; a-b-c-d is three links of 1 ms; b-d is the
    narrowest link of the graph (8 Mbit/s) but lies on a slow path (1 + 10 ms)."""
    return Topology.from_links([
        {"src": "a", "dst": "d", "rtt_ms": 10.0, "bandwidth_mbps": 1000},
        {"src": "a", "dst": "b", "rtt_ms": 2.0, "bandwidth_mbps": 800},
        {"src": "b", "dst": "c", "rtt_ms": 2.0, "bandwidth_mbps": 80},
        {"src": "c", "dst": "d", "rtt_ms": 2.0, "bandwidth_mbps": 400},
        {"src": "b", "dst": "d", "rtt_ms": 20.0, "bandwidth_mbps": 8},
    ])


# --- hand counts ------------------------------------------------------------------------


def test_lowest_latency_path_is_taken_over_the_fewest_hop_path():
    """a to d: three 1 ms links (3 ms) beat the direct 5 ms link and the 11 ms a-b-d."""
    p = _four_nodes().path("a", "d")
    assert p.hops == ("a", "b", "c", "d")
    assert p.latency_s == pytest.approx(3e-3, rel=EXACT)
    assert p.rtt_s == pytest.approx(6e-3, rel=EXACT)


def test_bottleneck_is_the_minimum_along_the_chosen_path_not_the_global_minimum():
    """a to d crosses 800, 80 and 400 Mbit/s links: its bandwidth is 80 Mbit/s, not the
    8 Mbit/s of the b-d link it does not use."""
    assert _four_nodes().path("a", "d").bandwidth_bytes_per_s == _mbps(80)


def test_every_pair_of_the_four_node_graph_matches_a_hand_count():
    """All six pairs, latency (ms, one way) and bottleneck (Mbit/s) counted by hand."""
    expected = {
        ("a", "b"): (1.0, 800, ("a", "b")),
        ("a", "c"): (2.0, 80, ("a", "b", "c")),
        ("a", "d"): (3.0, 80, ("a", "b", "c", "d")),
        ("b", "c"): (1.0, 80, ("b", "c")),
        ("b", "d"): (2.0, 80, ("b", "c", "d")),
        ("c", "d"): (1.0, 400, ("c", "d")),
    }
    t = _four_nodes()
    for (x, y), (ms, mbps, hops) in expected.items():
        p = t.path(x, y)
        assert p.latency_s == pytest.approx(ms / 1e3, rel=EXACT), (x, y)
        assert p.bandwidth_bytes_per_s == _mbps(mbps), (x, y)
        assert p.hops == hops


def _clos_2x3() -> Topology:
    """2 spines, 3 leaves, 6 endpoints round robin: e0, e3 on leaf 0; e1, e4 on leaf 1;
    e2, e5 on leaf 2. Edge links 0.12 ms and 10 Gbit/s; leaf-spine 0.35 ms and 5 Gbit/s."""
    return Topology.clos(
        [f"e{i}" for i in range(6)], spine_count=2, leaf_count=3, hop_latency_ms=0.35,
        device_edge_latency_ms=0.12, edge_bandwidth_mbps=10_000, spine_bandwidth_mbps=5_000,
    )


def test_clos_same_leaf_pairs_are_two_edge_links_apart():
    """e0-e3, e1-e4, e2-e5 share a leaf: 2 x 0.12 ms, the edge bandwidth, via that leaf."""
    t = _clos_2x3()
    for i in range(3):
        p = t.path(f"e{i}", f"e{i + 3}")
        assert p.latency_s == pytest.approx(0.24e-3, rel=EXACT)
        assert p.bandwidth_bytes_per_s == _mbps(10_000)
        assert p.hops == (f"e{i}", f"leaf/{i}", f"e{i + 3}")


def test_clos_cross_leaf_pairs_cross_two_edge_and_two_spine_links():
    """Every pair on different leaves: 2 x 0.12 + 2 x 0.35 = 0.94 ms, bottleneck the 5 Gbit/s
    spine links, through spine/0 (the spines tie; spine/0 sorts first)."""
    t = _clos_2x3()
    leaf = {f"e{i}": i % 3 for i in range(6)}
    pairs = [(x, y) for x, y in itertools.combinations(leaf, 2) if leaf[x] != leaf[y]]
    assert len(pairs) == 12
    for x, y in pairs:
        p = t.path(x, y)
        assert p.latency_s == pytest.approx(0.94e-3, rel=EXACT)
        assert p.bandwidth_bytes_per_s == _mbps(5_000)
        assert p.hops == (x, f"leaf/{leaf[x]}", "spine/0", f"leaf/{leaf[y]}", y)


def test_clos_attach_places_endpoints_on_the_leaves_named():
    """With attach, a and b on leaf 1 are same-leaf neighbours and c on leaf 0 is across."""
    t = Topology.clos(
        ["a", "b", "c"], spine_count=1, leaf_count=2, hop_latency_ms=1.0, device_edge_latency_ms=0.5,
        attach={"a": 1, "b": 1, "c": 0},
    )
    assert t.path("a", "b").hops == ("a", "leaf/1", "b")
    assert t.path("a", "b").latency_s == pytest.approx(1e-3, rel=EXACT)
    assert t.path("a", "c").latency_s == pytest.approx(3e-3, rel=EXACT)
    assert t.path("a", "c").bandwidth_bytes_per_s == math.inf
    assert t.endpoints == ("a", "b", "c")


def test_complete_graph_links_every_pair_directly():
    """Four endpoints, 3 ms round trip and 100 Mbit/s: every pair 1.5 ms one way, 12.5 MB/s, direct."""
    names = ["w", "x", "y", "z"]
    t = Topology.complete(names, rtt_ms=3.0, bandwidth_mbps=100)
    for x, y in itertools.permutations(names, 2):
        assert t.path(x, y) == Path(latency_s=1.5e-3, bandwidth_bytes_per_s=12.5e6, hops=(x, y))


def test_self_path_has_zero_latency_and_infinite_bandwidth():
    """path(a, a) is no link at all."""
    assert _clos_2x3().path("e1", "e1") == Path(latency_s=0.0, bandwidth_bytes_per_s=math.inf, hops=("e1",))


def test_from_spec_builds_what_the_constructor_builds():
    """A clos spec gives the same paths as Topology.clos with the same arguments."""
    spec = {
        "type": "clos", "endpoints": [f"e{i}" for i in range(6)], "spine_count": 2, "leaf_count": 3,
        "hop_latency_ms": 0.35, "device_edge_latency_ms": 0.12, "edge_bandwidth_mbps": 10_000,
        "spine_bandwidth_mbps": 5_000,
    }
    a, b = Topology.from_spec(spec), _clos_2x3()
    for x, y in itertools.combinations(b.endpoints, 2):
        assert a.path(x, y) == b.path(x, y)


def test_from_spec_links_without_bandwidth_is_unlimited():
    """A link with no bandwidth_mbps (or null) has infinite bandwidth."""
    t = Topology.from_spec({"type": "links", "links": [
        {"src": "p", "dst": "q", "rtt_ms": 1}, {"src": "q", "dst": "r", "rtt_ms": 1, "bandwidth_mbps": None},
    ]})
    assert t.path("p", "r").bandwidth_bytes_per_s == math.inf


# --- ties -------------------------------------------------------------------------------


def test_equal_latency_ties_go_to_the_fewest_links():
    """a-c direct (2 ms round trip) and a-b-c (1 + 1 ms) take the same 1 ms one way: the
    direct link wins, though a-b-c is wider."""
    t = Topology.from_links([
        {"src": "a", "dst": "c", "rtt_ms": 2.0, "bandwidth_mbps": 10},
        {"src": "a", "dst": "b", "rtt_ms": 1.0},
        {"src": "b", "dst": "c", "rtt_ms": 1.0},
    ])
    p = t.path("a", "c")
    assert p.hops == ("a", "c") and p.bandwidth_bytes_per_s == _mbps(10)


def test_equal_latency_and_links_ties_go_to_the_widest_then_to_the_smallest_names():
    """Two 2-link paths a-x-d and a-y-d of equal latency: the wider (via y) wins; when
    equally wide, the one via x (x < y)."""
    def build(x_mbps: float) -> Topology:
        return Topology.from_links([
            {"src": "a", "dst": "x", "rtt_ms": 1.0, "bandwidth_mbps": x_mbps},
            {"src": "x", "dst": "d", "rtt_ms": 1.0},
            {"src": "a", "dst": "y", "rtt_ms": 1.0, "bandwidth_mbps": 100},
            {"src": "y", "dst": "d", "rtt_ms": 1.0},
        ])

    assert build(10).path("a", "d").hops == ("a", "y", "d")
    assert build(100).path("a", "d").hops == ("a", "x", "d")
    assert build(100).path("d", "a").hops == ("d", "x", "a")


def test_latencies_tie_when_their_exact_sums_are_equal():
    """a-m-b (0.1 + 0.2 ms one way) against a-b (0.3 ms): the path whose links' latencies
    add up to less, exactly (counted with Fractions, not float additions), wins, and the
    answer is the same both ways round."""
    t = Topology.from_links([
        {"src": "a", "dst": "m", "rtt_ms": 0.2}, {"src": "m", "dst": "b", "rtt_ms": 0.4},
        {"src": "a", "dst": "b", "rtt_ms": 0.6},
    ])
    two = Fraction(0.2 / 2 / 1e3) + Fraction(0.4 / 2 / 1e3)
    one = Fraction(0.6 / 2 / 1e3)
    expected = ("a", "b") if one <= two else ("a", "m", "b")
    assert t.path("a", "b").hops == expected
    assert t.path("b", "a").hops == expected[::-1]
    assert t.path("a", "b").latency_s == float(min(one, two))


def test_path_is_the_same_both_ways():
    """path(b, a) visits path(a, b)'s nodes in reverse, with identical latency and bandwidth."""
    t = _four_nodes()
    for x, y in itertools.permutations("abcd", 2):
        p, q = t.path(x, y), t.path(y, x)
        assert q.hops == p.hops[::-1]
        assert (q.latency_s, q.bandwidth_bytes_per_s) == (p.latency_s, p.bandwidth_bytes_per_s)


@st.composite
def _graphs(draw):
    """Small connected-or-not graphs with integer latencies (exact sums, many ties) and a few bandwidths."""
    n = draw(st.integers(2, 6))
    nodes = [f"n{i}" for i in range(n)]
    pairs = list(itertools.combinations(nodes, 2))
    chosen = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=len(pairs)))
    g = nx.Graph()
    g.add_nodes_from(nodes)
    for u, v in chosen:
        g.add_edge(u, v, latency_s=float(draw(st.integers(0, 3))),
                   bandwidth_bytes_per_s=draw(st.sampled_from([1.0, 2.0, 5.0, math.inf])))
    return g


@settings(max_examples=200, deadline=None)
@given(_graphs(), st.data())
def test_path_agrees_with_brute_force_over_all_simple_paths(g, data):
    """Against every simple path: least latency, then fewest links, then widest, then the
    smallest names read from the endpoint that sorts first; no path raises ValueError."""
    a, b = data.draw(st.sampled_from(sorted(g.nodes))), data.draw(st.sampled_from(sorted(g.nodes)))
    t = Topology(g)
    if a == b:
        assert t.path(a, b).hops == (a,)
        return
    src, dst = min(a, b), max(a, b)
    candidates = list(nx.all_simple_paths(g, src, dst))
    if not candidates:
        with pytest.raises(ValueError, match="no path"):
            t.path(a, b)
        return

    def latency(p):
        return sum(g.edges[u, v]["latency_s"] for u, v in itertools.pairwise(p))

    def width(p):
        return min(g.edges[u, v]["bandwidth_bytes_per_s"] for u, v in itertools.pairwise(p))

    best = min(candidates, key=lambda p: (latency(p), len(p), -width(p), p))
    got = t.path(a, b)
    assert got.latency_s == latency(best)
    assert got.bandwidth_bytes_per_s == width(best)
    assert got.hops == (tuple(best) if a == src else tuple(best[::-1]))
    back = t.path(b, a)  # answered from a's tree, already built
    assert back.hops == got.hops[::-1]
    assert (back.latency_s, back.bandwidth_bytes_per_s) == (got.latency_s, got.bandwidth_bytes_per_s)


# --- errors -----------------------------------------------------------------------------


def test_unknown_endpoint_is_named():
    """Asking for a node that is not an endpoint names it (and both when both are unknown)."""
    t = _clos_2x3()
    with pytest.raises(ValueError, match=r"unknown endpoint 'nope'; endpoints: 'e0'"):
        t.path("e0", "nope")
    with pytest.raises(ValueError, match=r"unknown endpoints 'x', 'y'"):
        t.path("x", "y")
    with pytest.raises(ValueError, match=r"unknown endpoint 'leaf/0'"):
        t.path("leaf/0", "e1")  # fabric nodes are not endpoints


def test_disconnected_endpoints_have_no_path():
    """Two components: a path between them is a ValueError naming both endpoints."""
    t = Topology.from_links([{"src": "a", "dst": "b", "rtt_ms": 1}, {"src": "c", "dst": "d", "rtt_ms": 1}])
    with pytest.raises(ValueError, match=r"no path between endpoints 'a' and 'd'"):
        t.path("a", "d")


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        ({"type": "mesh"}, "type", "one of: links, complete, clos"),
        ({"endpoints": ["a"]}, "type", "required key is missing"),
        ({"type": "complete", "endpoints": ["a", "b"], "rtt_ms": 1, "jitter_pct": 0.05}, "jitter_pct",
         "unknown key; allowed: type, endpoints, rtt_ms, bandwidth_mbps"),
        ({"type": "complete", "endpoints": ["a", "b"]}, "rtt_ms", "required key is missing"),
        ({"type": "complete", "endpoints": ["a", "b"], "rtt_ms": "1"}, "rtt_ms", "must be a number"),
        ({"type": "complete", "endpoints": ["a", "b"], "rtt_ms": True}, "rtt_ms", "must be a number"),
        ({"type": "complete", "endpoints": ["a", "b"], "rtt_ms": -1}, "rtt_ms", "must be in [0"),
        ({"type": "complete", "endpoints": ["a", "b"], "rtt_ms": 1, "bandwidth_mbps": 0}, "bandwidth_mbps", "must be > 0"),
        ({"type": "complete", "endpoints": ["a", "a"], "rtt_ms": 1}, "endpoints[1]", "duplicate endpoint 'a'"),
        ({"type": "complete", "endpoints": "ab", "rtt_ms": 1}, "endpoints", "must be a list"),
        ({"type": "links", "links": []}, "links", "at least one link"),
        ({"type": "links", "links": [{"src": "a", "dst": "b", "rtt_ms": 1}, {"src": "b", "dst": "c", "rtt_ms": float("nan")}]},
         "links[1].rtt_ms", "finite"),
        ({"type": "links", "links": [{"src": "a", "dst": "b"}]}, "links[0].rtt_ms", "required key is missing"),
        ({"type": "links", "links": [{"src": "a", "dst": "b", "rtt_ms": 1, "bw": 5}]}, "links[0].bw",
         "allowed: src, dst, rtt_ms, bandwidth_mbps"),
        ({"type": "links", "links": [{"src": "a", "dst": "b", "rtt_ms": 1}, {"src": "b", "dst": "a", "rtt_ms": 2}]},
         "links[1]", "duplicate link between 'b' and 'a'"),
        ({"type": "links", "links": [{"src": "a", "dst": "a", "rtt_ms": 1}]}, "links[0].dst", "two different nodes"),
        ({"type": "links", "links": [{"src": 3, "dst": "a", "rtt_ms": 1}]}, "links[0].src", "non-empty string"),
        ({"type": "clos", "endpoints": ["a"], "spine_count": 0, "leaf_count": 1, "hop_latency_ms": 1,
          "device_edge_latency_ms": 1}, "spine_count", "must be in [1, 4096]"),
        ({"type": "clos", "endpoints": ["a"], "spine_count": 2.0, "leaf_count": 1, "hop_latency_ms": 1,
          "device_edge_latency_ms": 1}, "spine_count", "must be an integer"),
        ({"type": "clos", "endpoints": ["a"], "spine_count": 4096, "leaf_count": 4096, "hop_latency_ms": 1,
          "device_edge_latency_ms": 1}, "leaf_count", "leaf-spine links"),
        ({"type": "clos", "endpoints": ["a"], "spine_count": 1, "leaf_count": 1, "hop_latency_ms": 1},
         "device_edge_latency_ms", "required key is missing"),
    ],
)
def test_from_spec_errors_name_the_key(spec, field, message):
    """Each bad spec raises FieldValueError whose field is the key path relative to the spec."""
    with pytest.raises(FieldValueError) as info:
        Topology.from_spec(spec)
    assert info.value.field == field
    assert message in info.value.message


def _clos_spec(**kw):
    spec = {"type": "clos", "endpoints": ["a", "b"], "spine_count": 1, "leaf_count": 2, "hop_latency_ms": 1,
            "device_edge_latency_ms": 1}
    return {**spec, **kw}


@pytest.mark.parametrize(
    ("attach", "field", "message"),
    [
        ({"a": 0, "b": 2}, "attach.b", "leaf index in [0, 1], got 2"),
        ({"a": 0, "b": -1}, "attach.b", "leaf index in [0, 1]"),
        ({"a": 0, "b": True}, "attach.b", "leaf index"),
        ({"a": 0, "b": "1"}, "attach.b", "leaf index"),
        ({"a": 0, "b": 1, "c": 0}, "attach.c", "not an endpoint; endpoints: 'a', 'b'"),
        ({"a": 0}, "attach", "must place every endpoint (or be left out for round robin); missing: 'b'"),
        ([0, 1], "attach", "must be a mapping"),
    ],
)
def test_clos_attach_is_validated(attach, field, message):
    """attach must map every endpoint, and only endpoints, to a leaf index in range."""
    with pytest.raises(FieldValueError) as info:
        Topology.from_spec(_clos_spec(attach=attach))
    assert info.value.field == field
    assert message in info.value.message


def test_clos_endpoint_named_like_a_fabric_node_is_rejected():
    """An endpoint called leaf/1 would merge with the fabric's leaf: the error names it."""
    with pytest.raises(FieldValueError) as info:
        Topology.from_spec(_clos_spec(endpoints=["a", "leaf/1"]))
    assert info.value.field == "endpoints[1]"
    assert "fabric node" in info.value.message


def test_graph_given_directly_is_validated_and_copied():
    """A graph edge without latency_s is refused; a valid graph is copied, so editing it
    afterwards does not change the topology."""
    bad = nx.Graph()
    bad.add_edge("a", "b", bandwidth_bytes_per_s=1.0)
    with pytest.raises(ValueError, match="edge 'a'-'b': latency_s"):
        Topology(bad)
    g = nx.Graph()
    g.add_edge("a", "b", latency_s=1.0, bandwidth_bytes_per_s=1.0)
    t = Topology(g)
    g.edges["a", "b"]["latency_s"] = 5.0
    assert t.path("a", "b").latency_s == 1.0
    with pytest.raises(nx.NetworkXError):
        t.graph.add_edge("a", "c")
