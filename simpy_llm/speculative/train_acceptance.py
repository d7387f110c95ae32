"""Train an acceptance regressor bundle on a profiling log and judge it on a held-out one.

``python -m simpy_llm.speculative.train_acceptance LOG --out BUNDLE.joblib --drafter D
--verifier V --source S [--estimator gradient_boosting | mixture_of_experts --edges 512,2048]
[--held-out LOG2]`` (seed 003 §5.4,
"Acceptance Profiling Pipeline", steps 3 and 4, in one command): :func:`main`. The command
is a module of its own, imported by nothing, so that ``python -m`` runs it once (the
package imports :mod:`~simpy_llm.speculative.regressor` on its way to this module).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from simpy_llm.config.errors import ScenarioError
from simpy_llm.speculative.acceptance import METHODS
from simpy_llm.speculative.evaluation import AcceptanceEvaluation, evaluate_acceptance
from simpy_llm.speculative.profiling_log import profiling_rows_from_steps, read_profiling_log
from simpy_llm.speculative.regressor import ESTIMATORS, EXPERTS, GATES, train_acceptance_regressor

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["main"]


def _logged(path: str, per_step: bool) -> pd.DataFrame:
    """The profiling log in file *path* (per-token rows; a per-step log turned into them)."""
    log = read_profiling_log(path)
    return profiling_rows_from_steps(log) if per_step else log


def _edges(text: str) -> tuple[float, ...]:
    """``--edges 512,2048`` as numbers (their checks are the trainer's)."""
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"edges are comma-separated numbers, got {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m simpy_llm.speculative.train_acceptance LOG --out BUNDLE.joblib --drafter D --verifier V --source S``.

    Trains a bundle (:func:`~simpy_llm.speculative.regressor.train_acceptance_regressor`) on the profiling log file LOG
    (:func:`~simpy_llm.speculative.profiling_log.read_profiling_log`), writes it, and prints
    its MAE, Brier score, expected calibration error and reliability curve on LOG itself
    (in-sample) and, with ``--held-out``, on a held-out log
    (:func:`~simpy_llm.speculative.evaluation.evaluate_acceptance`); ``--metrics-json``
    writes them as JSON. Returns the exit status: 0, or 2 after printing an error.
    """
    parser = argparse.ArgumentParser(
        prog="python -m simpy_llm.speculative.train_acceptance",
        description="Train an acceptance regressor bundle on a per-token profiling log (seed 003 §5.4) and judge it on a held-out log.",
    )
    parser.add_argument("log", help="the training profiling log: .csv, .jsonl or .parquet (docs/speculative.md)")
    parser.add_argument("--out", required=True, help="the bundle to write (.joblib)")
    parser.add_argument("--name", help="the bundle's name (default: the --out file name without .joblib)")
    parser.add_argument("--drafter", required=True, help="the draft model")
    parser.add_argument("--verifier", required=True, help="the target (verifier) model")
    parser.add_argument("--source", required=True, help="where the profiling log comes from")
    parser.add_argument("--method", choices=METHODS, default="standard", help="how drafts were made and verified (default standard)")
    parser.add_argument("--notes", default="", help="free text kept in the bundle")
    parser.add_argument("--estimator", choices=ESTIMATORS, default="random_forest", help="the model (default random_forest)")
    parser.add_argument("--gate", choices=GATES, default="context_len",
                        help="mixture_of_experts: the feature whose regimes get an expert each (default context_len)")
    parser.add_argument("--edges", type=_edges, default=(),
                        help="mixture_of_experts: where one regime ends and the next begins, ascending, comma-separated (e.g. 512,2048)")
    parser.add_argument("--expert", choices=EXPERTS, default="random_forest",
                        help="mixture_of_experts: each regime's model (default random_forest)")
    parser.add_argument("--n-estimators", type=int, default=100, help="trees of the forest, or boosting rounds (default 100)")
    parser.add_argument("--min-samples-leaf", type=int, default=50, help="fewest rows in a leaf (default 50)")
    parser.add_argument("--k-max", type=int, help="longest chain the bundle answers for (default: the log's largest position)")
    parser.add_argument("--seed", type=int, default=0, help="random_state of the model (default 0)")
    parser.add_argument("--per-step", action="store_true",
                        help="the logs are per-step (context_len, temperature, k, accepted_count), turned into per-token rows")
    parser.add_argument("--held-out", help="a held-out profiling log to judge the bundle on (same format as LOG)")
    parser.add_argument("--bins", type=int, default=10, help="equal-width bins of the reliability curve and the ECE (default 10)")
    parser.add_argument("--metrics-json", help="write the figures to this JSON file ({in_sample, held_out})")
    args = parser.parse_args(argv)
    if not args.out.endswith(".joblib"):
        parser.error(f"--out must name a .joblib file, got {args.out!r}")
    if args.bins < 1:
        parser.error(f"--bins must be >= 1, got {args.bins}")
    try:
        log = _logged(args.log, args.per_step)
        held_out = _logged(args.held_out, args.per_step) if args.held_out else None
        model = train_acceptance_regressor(
            log, name=args.name or Path(args.out).stem, drafter=args.drafter, verifier=args.verifier, method=args.method,
            source=args.source, notes=args.notes, k_max=args.k_max, n_estimators=args.n_estimators,
            min_samples_leaf=args.min_samples_leaf, random_state=args.seed, estimator=args.estimator,
            gate=args.gate, edges=args.edges, expert=args.expert,
        )
        path = model.save(args.out)
        temps = ", ".join(f"{t:g}" for t in model.temperatures)
        print(f"trained {model.kind} on {model.n_rows} rows of {args.log} (k_max {model.k_max}, temperatures {temps}): wrote {path}")
        figures: dict[str, AcceptanceEvaluation] = {"in_sample": evaluate_acceptance(model, log, bins=args.bins)}
        if held_out is not None:
            figures["held_out"] = evaluate_acceptance(model, held_out, bins=args.bins)
        for label, evaluation in figures.items():
            print(f"{label.replace('_', '-')}: {evaluation.report()}")
        if args.metrics_json:
            Path(args.metrics_json).write_text(json.dumps({k: e.to_dict() for k, e in figures.items()}, indent=2) + "\n")
    except (OSError, ValueError, TypeError, ImportError, ScenarioError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
