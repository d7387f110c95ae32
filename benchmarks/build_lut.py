"""Build a ``lut`` latency table from the shipped ``profile`` latency model (Vidur's operator profiles).

Run from the repository root::

    python -m benchmarks.build_lut --out profiles/luts/meta-llama-3-8b_a100_tp1.csv   # the shipped LUT
    python -m benchmarks.build_lut --model Meta-Llama-3-70B --gpu a100 --tp 4 --out /tmp/llama3-70b_a100_tp4.csv

It evaluates :class:`~simpy_llm.serving.profiled.ProfiledLatency` (``model``, ``gpu``, ``tp``;
no alpha overheads) on a log-spaced grid and writes one row per grid point:

* ``prefill`` rows (``microbatch`` 1): one fresh prompt of ``context_len`` tokens,
  ``step_time_s(context_len, 0, prefill_attention_pairs=context_len (context_len + 1) / 2)``;
* ``decode`` rows: ``microbatch`` sequences decoding one token each with ``context_len``
  tokens in each KV cache, ``step_time_s(0, microbatch, decode_context_tokens=context_len x microbatch)``.

``latency_ms`` is that time in ms, written with every digit of the float (``repr``) so the
file reproduces the model exactly at its grid points. ``hardware`` is the shipped GPU name
(``H100``, ``A100-80``), ``model`` the Vidur profile folder, ``dtype`` fp16 (Vidur profiled
its operators in float16), ``source`` ``vidur_profile_model``, and ``notes`` says how each
row was made. The default grid is the seed's: contexts 128 ... 8192 and microbatches 1 ... 256,
powers of two. The rows are validated by :func:`simpy_llm.serving.lut.load_lut` before the
file is written; a table that fails (e.g. a latency that falls as the batch grows) is not
written, and the problems are printed.

Which profiles pass: Meta-Llama-3-8B on a100 at tp 1 (shipped). The Llama 2 profiles do not,
for two reasons in the ``profile`` model's inputs, not in this script: Vidur measured one
token slower than two (H100 Llama-2-7b-hf tp 1: 0.175 against 0.171 ms per layer), so a
decode step of one sequence takes longer than one of two; and their measurements stop at 4096
tokens, where the last two points fall (4064: 2.6145, 4096: 2.6002 ms per layer), so the
``profile`` model's linear extrapolation makes an 8192-token prefill faster than a
4096-token one. No shipped GPU has a Vidur profile of Llama 3 8B on H100.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import tempfile
from pathlib import Path

CONTEXTS = (128, 256, 512, 1024, 2048, 4096, 8192)
"""Context lengths of the grid, tokens (the seed's log-spaced bins)."""
MICROBATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
"""Decode batch sizes of the grid, sequences."""
COLUMNS = (
    "phase", "model", "hardware", "tensor_parallel", "pipeline_parallel", "context_len",
    "microbatch", "fanout_k", "dtype", "latency_ms", "source", "notes",
)


def rows(model: str, gpu: str, tp: int, contexts: tuple[int, ...] = CONTEXTS,
         microbatches: tuple[int, ...] = MICROBATCHES) -> list[dict[str, object]]:
    """The LUT rows of ``profile`` (*model*, *gpu*, *tp*) on the grid."""
    from simpy_llm.serving.profiled import _VIDUR_GPUS, ProfiledLatency

    prof = ProfiledLatency(model=model, gpu=gpu, tp=tp)
    hardware = _VIDUR_GPUS[gpu.lower()]
    base = {"model": model, "hardware": hardware, "tensor_parallel": tp, "pipeline_parallel": 1,
            "fanout_k": 1, "dtype": "fp16", "source": "vidur_profile_model"}
    made = (f"simpy_llm profile latency model (Vidur's measured non-attention operators, analytic "
            f"attention/all-reduce/LM head), ProfiledLatency(model={model}, gpu={gpu.lower()}, tp={tp})")
    out: list[dict[str, object]] = []
    for c in contexts:
        s = prof.step_time_s(c, 0, prefill_attention_pairs=c * (c + 1) // 2)
        out.append({**base, "phase": "prefill", "context_len": c, "microbatch": 1, "latency_ms": repr(s * 1e3),
                    "notes": f"{made}.step_time_s({c}, 0, prefill_attention_pairs={c * (c + 1) // 2}) in ms"})
    for c in contexts:
        for b in microbatches:
            s = prof.step_time_s(0, b, decode_context_tokens=c * b)
            out.append({**base, "phase": "decode", "context_len": c, "microbatch": b, "latency_ms": repr(s * 1e3),
                        "notes": f"{made}.step_time_s(0, {b}, decode_context_tokens={c * b}) in ms"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="Meta-Llama-3-8B", help="Vidur model folder (default Meta-Llama-3-8B)")
    ap.add_argument("--gpu", default="a100", help="Vidur GPU: a100 or h100 (default a100)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    ap.add_argument("--out", required=True, type=Path, help="CSV file to write")
    args = ap.parse_args()

    from simpy_llm.config.errors import ScenarioError
    from simpy_llm.serving.lut import load_lut

    table = rows(args.model, args.gpu, args.tp)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        draft = Path(tmp) / args.out.name
        with open(draft, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=COLUMNS, lineterminator="\n")
            writer.writeheader()
            writer.writerows(table)
        try:
            lut = load_lut(draft)
        except ScenarioError as exc:
            shown = ScenarioError(str(args.out), exc.problems, what=exc.what)
            raise SystemExit(f"not written: the table fails validation\n{shown}") from None
        shutil.copyfile(draft, args.out)
    print(f"wrote {args.out}: {len(table)} rows, {len(lut.slices)} slices")


if __name__ == "__main__":
    main()
