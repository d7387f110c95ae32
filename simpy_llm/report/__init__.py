"""A self-contained HTML report (one file, offline, interactive plotly figures) of a simulation
run, an observed trace or a calibration; docs/report.md.

:mod:`~simpy_llm.report.figures` makes the figures (:func:`rate_curves_figure` among them),
:mod:`~simpy_llm.report.html` lays out the page, :mod:`~simpy_llm.report.sources` builds each
kind of page from results in memory or from a command's output directory (it loads pandas, so it
is not imported here), :mod:`~simpy_llm.report.cli` is ``--html`` and ``simpy-llm report``.
plotly is the ``report`` extra, imported when a figure is made.
"""

from __future__ import annotations

from simpy_llm.report.figures import rate_curves_figure, require_plotly
from simpy_llm.report.html import Page, Plot, Section, Table, render_page, write_page

__all__ = ["Page", "Plot", "Section", "Table", "rate_curves_figure", "render_page", "require_plotly", "write_page"]
