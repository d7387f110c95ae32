"""``--html FILE`` of ``run``, ``observe`` and ``calibrate compare``, and ``simpy-llm report DIR --html FILE``.

Every command checks its ``--html`` file before it simulates or sends anything (:func:`html_ok`:
plotly installed, the file writable), so a missing extra never costs a run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["HTML_HELP", "add_parser", "html_ok", "main", "write_html"]

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
    from simpy_llm.output_paths import OutputPathError, check_output_file
    from simpy_llm.report.figures import require_plotly

    if path is None:
        return True
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
