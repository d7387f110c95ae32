"""``--html FILE`` of ``run``, ``observe``, ``calibrate compare`` and ``bench``, and ``simpy-llm report DIR --html FILE``.

Every command checks its ``--html`` file before it simulates or sends anything (:func:`html_ok`:
plotly installed, the file writable), so a missing extra never costs a run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["HTML_HELP", "add_parser", "bench_page_ok", "html_ok", "main", "write_bench_html", "write_html"]

HTML_HELP = "also write a self-contained HTML report (interactive plots, works offline) to FILE (needs the report extra)"
"""The help of every command's ``--html``."""


def add_parser(sub: Any) -> None:
    """Add ``report DIR --html FILE`` to the subparsers *sub*."""
    rep = sub.add_parser("report", help="write the HTML report of an output directory of run, observe, calibrate compare or bench")
    rep.add_argument("directory", metavar="DIR",
                     help="what run, observe, calibrate compare or bench wrote with --out (told apart by its files)")
    rep.add_argument("--html", metavar="FILE", required=True, help="the HTML file to write")
    rep.set_defaults(plugins=[], overrides=[])  # it reads no scenario: no --set, no --plugin


def html_ok(path: str | None) -> bool:
    """Whether ``--html`` *path* can be written: plotly is installed and the file's directory
    takes it (:func:`~simpy_llm.output_paths.check_output_file`); prints why not. True without one."""
    if path is None:  # before the imports: a command without --html loads neither the figures nor plotly
        return True
    from simpy_llm.output_paths import OutputPathError, check_output_file
    from simpy_llm.report.figures import require_plotly

    try:
        require_plotly()
        check_output_file(path, option="--html")
    except (ImportError, OutputPathError) as exc:
        print(f"--html: {exc}" if isinstance(exc, ImportError) else exc, file=sys.stderr)
        return False
    return True


def write_html(page: Any, path: str | Path) -> None:
    """Write the :class:`~simpy_llm.report.html.Page` *page* to *path* and say so."""
    from simpy_llm.report.html import write_page

    print(f"wrote {write_page(page, path)}")


def bench_page_ok(args: argparse.Namespace) -> bool:
    """Whether a benchmark's ``--html`` page can be drawn: its curves are p50 and p99, so p99 must
    be among the percentiles (the benchmark's own for ``bench compare``); prints why not."""
    if args.html is None:
        return True
    if args.bench_command == "compare":
        import json

        try:
            percentiles = json.loads((Path(args.measured) / "bench.json").read_text(encoding="utf-8")).get("percentiles", [])
        except (OSError, ValueError):
            return True  # the command itself says what is wrong with the directory
    else:
        from simpy_llm.observe.bench.metrics import parse_percentiles

        try:
            percentiles = parse_percentiles(args.percentiles)
        except ValueError:
            return True  # the command itself refuses the percentiles
    if 99.0 in [float(p) for p in percentiles]:
        return True
    print("--html draws p50 and p99 against the request rate: add 99 to --percentiles", file=sys.stderr)
    return False


def write_bench_html(result: Any, predicted: Any, errors: Any, path: str) -> None:
    """``bench predict --html`` / ``bench compare --html``: the benchmark's page (handed over by
    the calibrator's layer, which sits below the report's)."""
    from simpy_llm.report.sources import bench_page

    write_html(bench_page(result, predicted, errors), path)


def main(args: argparse.Namespace) -> int:
    """``simpy-llm report DIR --html FILE``: 0, or 2 when *DIR* is not an output directory it knows or a file in it is bad."""
    from simpy_llm.config import ScenarioError
    from simpy_llm.report.sources import directory_page

    if not html_ok(args.html):
        return 2
    try:
        page = directory_page(args.directory)
    except ScenarioError as exc:
        print(exc, file=sys.stderr)
        return 2
    write_html(page, args.html)
    return 0
