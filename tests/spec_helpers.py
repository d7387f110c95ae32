"""Speculative-decoding scenarios as plain data, for the tests."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import tiny_scenario


def flat_curve(path: Path, p: list[float], name: str = "flat") -> str:
    """Write an acceptance curve whose position probabilities are *p* at every context; returns its path."""
    data = {
        "name": name, "drafter": "test drafter", "verifier": "test verifier", "method": "standard",
        "illustrative": True, "source": "hand-written for a test",
        "curves": [{"temperature": 0.0, "context_len": [16, 1_000_000], "acceptance": [list(p), list(p)]}],
    }
    file = path / f"{name}.yaml"
    file.write_text(yaml.safe_dump(data))
    return str(file)


def spec_scenario(
    curve: str,
    *,
    requests: int = 50,
    rate: float = 5.0,
    prompt: int = 128,
    output: int = 64,
    devices: int = 4,
    draft_token_ms: float = 10.0,
    network: dict[str, Any] | None = None,
    speculation: dict[str, Any] | None = None,
    group: dict[str, Any] | None = None,
    replicas: int = 1,
    latency: dict[str, Any] | None = None,
    engine: dict[str, Any] | None = None,
    seed: int = 1,
) -> dict[str, Any]:
    """One client with constant lengths, *replicas* targets and one draft group of *devices*."""
    data = tiny_scenario(seed=seed)
    data["workload"].update({"aggregate_rate": rate, "num_requests": requests})
    client = data["workload"]["clients"][0]
    client["input_distribution"] = {"type": "constant", "params": {"value": prompt}}
    client["output_distribution"] = {"type": "constant", "params": {"value": output}}
    serving = data["serving"]
    serving["replicas"] = replicas
    serving["engine"] = engine or {"max_num_seqs": 64, "max_num_batched_tokens": 4096, "kv_block_size": 16, "kv_num_blocks": 4096}
    serving["latency_model"] = latency or {"kind": "blis_linear", "params": {"beta0_us": 5000.0, "beta1_us": 50.0, "beta2_us": 200.0}}
    draft_group = {
        "name": "phones", "count": devices,
        "drafters": [{"name": "d0", "acceptance": curve, "draft_token_ms": draft_token_ms}],
    }
    if network is not None:
        draft_group["network"] = network
    draft_group.update(group or {})
    spec = {"mode": "distributed", "k_max": 4, "temperature": 0.0, "drafts": [draft_group]}
    spec.update(speculation or {})
    data["speculation"] = spec
    return copy.deepcopy(data)
