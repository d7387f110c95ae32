"""Speed benchmark: ``calibrate fit`` on a 500-request observed trace (target: under 2 minutes).

Run from the repository root::

    python -m benchmarks.bench_calibrate                  # 500 requests, default refinement budget
    python -m benchmarks.bench_calibrate --requests 1000 --max-evaluations 400 --repeat 3

The trace is a simulated observation (:func:`simpy_llm.calibrate.simulated_observation`)
of a llama.cpp-like server (the ``llamacpp`` engine preset, 4 slots) under a Poisson load
with prompts from 20 to about 2,000 tokens, so every stage of the fit has work to do: the
direct estimate reconstructs every step, and the refinement replays the trace once per
candidate. The refinement starts from a direct estimate perturbed by ±20 % (as a noisy
real trace would give; the identification sees the estimate as it is), so it runs its
whole budget. The figures printed: the
wall time of the direct estimate and of the whole fit (identification included), the
number of replays (and those that identified the coefficients) and the time per replay,
and how far the refined coefficients are from the truth. It asserts nothing.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

# the coefficients the identifiability tests use
from tests.calibrate.test_fit import TRUTH


def _scenario(requests: int):  # returns a Scenario
    from simpy_llm.loading import scenario_from_dict

    return scenario_from_dict({
        "seed": 3,
        "workload": {"aggregate_rate": 0.35, "num_requests": requests, "clients": [{
            "id": "open", "arrival": {"process": "poisson"},
            "input_distribution": {"type": "lognormal", "params": {"mu": 5.0, "sigma": 0.8}},
            "output_distribution": {"type": "uniform", "params": {"low": 8, "high": 96}},
        }]},
        "serving": {"engine": {"preset": "llamacpp", "n_parallel": 4, "ctx_per_slot": 4096, "cache_prompt": False},
                    "latency_model": {"kind": "batch_table", "params": TRUTH}},
    }, source="bench_calibrate")


def main() -> None:
    import importlib

    from simpy_llm.calibrate import simulated_observation

    fit_module = importlib.import_module("simpy_llm.calibrate.fit")  # the package exports fit(), the function

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--max-evaluations", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()

    print(f"machine: {platform.machine()} {platform.processor() or ''} {platform.python_version()}")
    with tempfile.TemporaryDirectory() as tmp:
        simulated_observation(_scenario(args.requests), Path(tmp) / "trace")
        walls, directs, replays, identifying, start_losses = [], [], [], [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            fit_module.direct_estimate(Path(tmp) / "trace", max_decoders=4, ubatch_tokens=512, prefill_breaks=(516, 4), budget_tokens=2048)
            directs.append(time.perf_counter() - t0)
            original = fit_module._Fitter.refine

            def perturbed(self, start, max_evaluations, start_loss=None, original=original):  # a noisy start for the refinement
                rng = np.random.default_rng(1)
                noisy = self.normalised({k: v if k in self.fixed else v * rng.uniform(0.8, 1.2) for k, v in start.items()})
                start_losses.append(self.loss(noisy))
                return original(self, noisy, max_evaluations, start_losses[-1])

            fit_module._Fitter.refine = perturbed
            try:
                t0 = time.perf_counter()
                result = fit_module.fit(Path(tmp) / "trace", max_evaluations=args.max_evaluations)
                walls.append(time.perf_counter() - t0)
            finally:
                fit_module._Fitter.refine = original
            replays.append(result.statistics["evaluations"])
            identifying.append(result.statistics["identification_replays"])
        fitted = result.params
    err = [abs(a / b - 1) for a, b in zip(fitted["decode_step_us"], TRUTH["decode_step_us"], strict=True)]
    err += [abs(fitted[k] / TRUTH[k] - 1) for k in TRUTH if k != "decode_step_us"]
    wall = statistics.median(walls)
    print(f"trace: {args.requests} requests (simulated observation, llamacpp preset, 4 slots)")
    print(f"direct estimate: {statistics.median(directs):.2f} s")
    print(f"fit (direct + identification + refinement): {wall:.1f} s median of {len(walls)}, {replays[-1]} replays "
          f"({identifying[-1]} to identify), {(wall - statistics.median(directs)) / max(replays[-1], 1) * 1e3:.0f} ms per replay")
    print(f"loss: {start_losses[-1]:.4f} (perturbed start) -> {result.statistics.get('loss_refined', float('nan')):.4f}")
    print(f"refined coefficients vs truth: max relative error {max(err):.1%}")
    print(f"target: under 120 s -> {'met' if wall < 120 else 'MISSED'}")


if __name__ == "__main__":
    main()
