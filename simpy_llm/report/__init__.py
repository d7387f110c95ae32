"""A self-contained HTML report (one file, offline, interactive plotly figures) of a simulation
run, an observed trace or a calibration; docs/report.md.

:mod:`~simpy_llm.report.figures` makes the figures (:func:`rate_curves_figure` among them),
:mod:`~simpy_llm.report.html` lays out the page, :mod:`~simpy_llm.report.sources` builds each
kind of page from results in memory or from a command's output directory (it loads pandas, so it
is not imported here), :mod:`~simpy_llm.report.cli` is ``--html`` and ``simpy-llm report``.
plotly is the ``report`` extra, imported when a figure is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simpy_llm.lazy import lazy_exports

if TYPE_CHECKING:
    from simpy_llm.report.figures import rate_curves_figure, require_plotly
    from simpy_llm.report.html import Page, Plot, Section, Table, render_page, write_page

_HOME = {
    "rate_curves_figure": ("figures", "rate_curves_figure"), "require_plotly": ("figures", "require_plotly"),
    "Page": ("html", "Page"), "Plot": ("html", "Plot"), "Section": ("html", "Section"), "Table": ("html", "Table"),
    "render_page": ("html", "render_page"), "write_page": ("html", "write_page"),
}
"""Each public name's module and its name there. They are imported on first use (PEP 562):
the command line reads ``--html``'s help (:mod:`simpy_llm.report.cli`) for every command, and
a ``simpy-llm run`` without ``--html`` needs neither the figures nor the page."""


__getattr__, __dir__ = lazy_exports(globals(), _HOME)


__all__ = ["Page", "Plot", "Section", "Table", "rate_curves_figure", "render_page", "require_plotly", "write_page"]
