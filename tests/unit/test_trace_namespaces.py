"""Prefix-block ids of replayed traces: each trace of a workload has its own range.

Mooncake numbers the blocks of every trace from 0, so two traces replayed in one scenario
would otherwise hit each other's cached blocks. The expected cached tokens below are hand
counts: one request runs at a time (``max_num_seqs: 1``, every earlier request has
finished), the KV cache never evicts, and a request reuses the cached blocks wholly inside
its first P - 1 prompt tokens that an earlier request *of the same trace* cached.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.config import ScenarioError
from simpy_llm.loading import load_workload
from simpy_llm.workload.sources import build_sources
from simpy_llm.workload.traces import read_mooncake

BS = 512  # Mooncake's tokens per hash id, and the KV block size used here


def _jsonl(path: Path, rows: list[tuple[float, list[int]]]) -> Path:
    """A Mooncake trace: (timestamp ms, hash_ids) per request, 1 output token, BS tokens per id."""
    lines = [json.dumps({"timestamp": ts, "input_length": BS * len(ids), "output_length": 1, "hash_ids": ids}) for ts, ids in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def two_traces(tmp_path: Path) -> tuple[Path, Path]:
    """Trace A: [0, 1, 2] at 0 s, [0, 1, 5] at 2 s. Trace B: the same ids [0, 1, 2] at 1 s, then [0, 1, 9] at 3 s."""
    a = _jsonl(tmp_path / "a.jsonl", [(0, [0, 1, 2]), (2000, [0, 1, 5])])
    b = _jsonl(tmp_path / "b.jsonl", [(1000, [0, 1, 2]), (3000, [0, 1, 9])])
    return a, b


def _scenario(*paths: Path) -> dict:
    return {
        "seed": 1,
        "workload": {"traces": [{"path": str(p), "format": "mooncake"} for p in paths]},
        "serving": {
            "engine": {"max_num_seqs": 1, "max_num_batched_tokens": 4096, "kv_block_size": BS, "kv_num_blocks": 256, "prefix_caching": True},
            # about 12 ms per request: each finishes long before the next arrives
            "latency_model": {"kind": "blis_linear", "params": {"beta0_us": 500.0, "beta1_us": 1.0, "beta2_us": 10.0}},
        },
    }


def test_two_mooncake_traces_share_no_cached_blocks_and_keep_their_own_hits(two_traces: tuple[Path, Path]) -> None:
    """B's first request (the same ids as A's first) finds nothing cached: A's blocks are not its
    own. Each trace's second request reuses its first's two leading blocks (2 x 512 tokens),
    as when it is replayed alone."""
    a, b = two_traces
    frame = Simulation(scenario_from_dict(_scenario(a, b))).run(progress=False).to_dataframe().sort_values("arrival_s")
    assert frame["status"].eq("completed").all()
    assert frame["cached_tokens"].tolist() == [0, 0, 2 * BS, 2 * BS]  # A1, B1, A2, B2
    alone = Simulation(scenario_from_dict(_scenario(a))).run(progress=False).to_dataframe()
    assert alone["cached_tokens"].tolist() == [0, 2 * BS]


def test_the_first_trace_keeps_its_ids_and_the_next_get_ranges_of_their_own(two_traces: tuple[Path, Path], tmp_path: Path) -> None:
    """In the workload's requests the first trace's block ids are the file's; the second's are
    moved by 2**63, so equal ids of one trace stay equal and the two ranges never meet."""
    a, b = two_traces
    spec = tmp_path / "w.yaml"
    spec.write_text(f"traces:\n  - {{path: {a}, format: mooncake}}\n  - {{path: {b}, format: mooncake}}\n")
    sources = build_sources(load_workload(spec)).generator_sources()
    blocks = [[row[3]["prefix_blocks"] for row in rows] for _, rows in sources]
    assert blocks[0] == [(0, 1, 2), (0, 1, 5)]
    assert blocks[1] == [(2**63, 2**63 + 1, 2**63 + 2), (2**63, 2**63 + 1, 2**63 + 9)]


@pytest.mark.parametrize("ids", ["[0, -3]", f"[{2**63}]"], ids=["negative", "2**63"])
def test_mooncake_hash_ids_outside_their_range_are_refused_naming_the_line(tmp_path: Path, ids: str) -> None:
    """A hash id below 0 (the range of a request's own content) or from 2**63 on (another trace's
    range) is refused with the file, line and key."""
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
                    f'{{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": {ids}}}\n')
    with pytest.raises(ScenarioError) as info:
        read_mooncake(path)
    assert info.value.source == str(path)
    assert info.value.paths == ["line 2, key hash_ids"]
    assert "[0, 2**63)" in info.value.problems[0][1]
