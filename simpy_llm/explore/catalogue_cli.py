"""``simpy-llm catalogue``: the measured latency profiles as a table (docs/latency.md, "The catalogue")."""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_verb", "print_catalogue"]


def add_verb(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``catalogue`` to the command line's verbs *sub*."""
    cat = sub.add_parser("catalogue", help="list the measured latency profiles (model, GPU, TP) and what is known of each")
    cat.add_argument("--csv", action="store_true", help="print CSV (one header row) instead of a table")
    cat.set_defaults(plugins=[])


def print_catalogue(*, csv_out: bool = False) -> int:
    """``simpy-llm catalogue``: every BLIS latency profile (a ``blis_linear`` ``model``, ``gpu``
    and ``tp``), its vLLM version, the model configuration it resolves to and whether its KV
    cache can be sized (:func:`simpy_llm.serving.catalogue.catalogue`)."""
    import csv

    import attrs

    from simpy_llm.serving.catalogue import CatalogueEntry, catalogue

    rows = catalogue()
    columns = [f.name for f in attrs.fields(CatalogueEntry)]
    if csv_out:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([[getattr(r, c) if getattr(r, c) is not None else "" for c in columns] for r in rows])
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"latency profiles: {len(rows)} (blis_linear model, gpu, tp)", header_style="bold")
    for c in columns:
        table.add_column(c, justify="right" if c == "tp" else "left", overflow="fold")
    for r in rows:
        table.add_row(r.model, r.gpu, str(r.tp), r.vllm, r.model_config or "-", "yes" if r.hardware else "no")
    Console(soft_wrap=True).print(table)
    return 0
