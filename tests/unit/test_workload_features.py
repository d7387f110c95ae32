"""Client features of the workload spec, end to end through the generator."""

from __future__ import annotations

import numpy as np

from tests.helpers import run, tiny_scenario


def _client(data):
    return data["workload"]["clients"][0]


def _generous(data, n=2000, rate=2000.0):
    data["workload"]["num_requests"] = n
    data["workload"]["aggregate_rate"] = rate
    data["serving"]["engine"].update(max_num_seqs=64, max_num_batched_tokens=4096, kv_num_blocks=200_000)
    return data


def test_lifecycle_windows_bound_arrivals():
    """A client with active windows sends requests only inside them, in both windows."""
    data = _generous(tiny_scenario(), n=1500, rate=1000.0)
    _client(data)["lifecycle"] = {"windows": [{"start_s": 1.0, "end_s": 1.5}, {"start_s": 3.0, "end_s": 10.0}]}
    t = run(data).columns["arrival_s"]
    inside = ((t >= 1.0) & (t < 1.5)) | ((t >= 3.0) & (t < 10.0))
    assert inside.all()
    first = int(((t >= 1.0) & (t < 1.5)).sum())
    assert 400 < first < 600  # ~500 expected at 1000/s for 0.5 s
    assert int((t >= 3.0).sum()) > 0


def test_prefix_group_is_prepended_and_shared():
    """Clients in one prefix group carry the same prefix blocks, and the prefix is part of the prompt."""
    data = _generous(tiny_scenario(), n=400)
    first = _client(data)
    first.update(prefix_group="system", prefix_length=100)
    second = dict(first, id="c1", prefix_group="system", prefix_length=100)
    third = dict(first, id="c2", prefix_group="", prefix_length=0)
    data["workload"]["clients"] = [first, second, third]
    frame = run(data).to_dataframe()
    grouped = frame[frame.prefix_group == "system"]
    assert (grouped.prefix_tokens == 100).all() and (grouped.prompt_tokens > 100).all()
    assert set(grouped.client_id) == {"c0", "c1"}
    assert (frame[frame.client_id == "c2"].prefix_tokens == 0).all()


def test_prefix_blocks_are_identical_within_a_group():
    """Requests of one group share their prefix block hashes; another seed gives other hashes."""
    from simpy_llm import Simulation, scenario_from_dict

    data = _generous(tiny_scenario(), n=50)
    _client(data).update(prefix_group="g", prefix_length=64)
    sim = Simulation(scenario_from_dict(data))
    blocks = {src.base["prefix_blocks"] for src in sim.sources}
    assert len(blocks) == 1 and len(next(iter(blocks))) == 4
    data["seed"] = 99
    other = Simulation(scenario_from_dict(data)).sources[0].base["prefix_blocks"]
    assert other != next(iter(blocks))


def test_streaming_probability_sets_the_share_of_streaming_requests():
    """streaming: 0.3 makes about 30 % of requests stream; true and false mean all and none."""
    data = _generous(tiny_scenario(), n=4000)
    _client(data)["streaming"] = 0.3
    share = run(data).columns["streaming"].mean()
    assert abs(share - 0.3) < 0.03
    _client(data)["streaming"] = False
    assert run(data).columns["streaming"].sum() == 0


def test_multimodal_prompt_is_the_sum_of_its_parts():
    """A multimodal prompt is text plus image, audio and video tokens; counts of 0 give 0 tokens."""
    data = _generous(tiny_scenario(), n=1000)
    _client(data)["multimodal"] = {
        "text_distribution": {"type": "constant", "params": {"value": 50}},
        "image_distribution": {"type": "constant", "params": {"value": 256}},
        "image_count_distribution": {"type": "exponential", "params": {"mean": 1.5}},
        "audio_distribution": {"type": "constant", "params": {"value": 30}},
        "audio_count_distribution": {"type": "constant", "params": {"value": 2}},
    }
    c = run(data).columns
    assert np.array_equal(c["prompt_tokens"], c["text_tokens"] + c["image_tokens"] + c["audio_tokens"] + c["video_tokens"])
    assert (c["text_tokens"] == 50).all() and (c["audio_tokens"] == 60).all() and (c["video_tokens"] == 0).all()
    assert set(np.unique(c["image_tokens"] % 256)) == {0}
    assert (c["image_tokens"] == 0).any() and (c["image_tokens"] >= 512).any()


def test_reasoning_ratio_is_recorded_in_the_unit_interval():
    """Reasoning clients record a reason_ratio drawn from their distribution, clipped to [0, 1]."""
    data = _generous(tiny_scenario(), n=1000)
    _client(data)["reasoning"] = {"reason_ratio_distribution": {"type": "exponential", "params": {"mean": 0.5}}}
    ratios = run(data).columns["reason_ratio"]
    assert ((ratios >= 0) & (ratios <= 1)).all()
    assert abs(ratios.mean() - 0.5 * (1 - np.exp(-2))) < 0.02  # E[min(X, 1)] for X ~ Exp(mean 0.5)
    assert (ratios == 1.0).any()


def test_priority_and_tenant_are_carried_on_records():
    """The client's priority and tenant appear on every record of that client."""
    data = _generous(tiny_scenario(), n=100)
    _client(data).update(priority=3, tenant_id="acme")
    frame = run(data).to_dataframe()
    assert (frame.priority == 3).all() and (frame.tenant_id == "acme").all()
