"""One self-contained HTML page of figures, tables and warnings.

The page carries plotly.js itself (inlined once, before the first figure: ``include_plotlyjs=True``),
so it opens offline, from a file, and asks no server for anything: no CDN, no fonts, no MathJax.
Every figure's ``<div>`` has a fixed id (a :class:`Plot`'s ``div_id``) and the page holds no
clock or random part, so the same numbers give the same bytes.

Examples
--------
>>> page = Page("demo", [Section("Numbers", table=Table(("metric", "p50 (s)"), [("TTFT", "0.120")]))])
>>> text = render_page(page)
>>> text.startswith("<!DOCTYPE html>"), "<td>0.120</td>" in text, "<script" in text
(True, True, False)
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

__all__ = ["Page", "Plot", "Section", "Table", "render_page", "write_page"]

PLOT_CONFIG: dict[str, Any] = {"displaylogo": False, "responsive": True, "toImageButtonOptions": {"format": "png"}}
"""plotly's figure options on the page: no link to plotly's site in the tool bar."""


@attrs.frozen
class Plot:
    """One figure on the page."""

    div_id: str
    """The id of the figure's ``<div>`` (unique on the page; letters, digits and ``-``)."""
    figure: Any
    """A ``plotly.graph_objects.Figure``."""
    caption: str = ""
    """What the figure shows, with the key paths its axes read (plain text; ``code`` spans in backquotes)."""


@attrs.frozen
class Table:
    """A table of text cells."""

    header: tuple[str, ...]
    rows: Sequence[Sequence[str]]


@attrs.frozen
class Section:
    """A heading with its notes, table and figures, in that order."""

    title: str
    plots: Sequence[Plot] = ()
    table: Table | None = None
    notes: Sequence[str] = ()
    """Paragraphs of plain text (backquoted parts shown as code)."""


@attrs.frozen
class Page:
    """A whole report: title, warnings (shown first, prominently), then the sections."""

    title: str
    sections: Sequence[Section]
    warnings: Sequence[str] = ()
    subtitle: str = ""


_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1100px; padding: 1em 2em;
       color: #222; background: #fff; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { font-size: 1.25em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
.subtitle { color: #555; margin-top: 0; }
.warnings { background: #fff4e5; border: 2px solid #e67e22; border-radius: 6px; padding: 0.6em 1.2em; margin: 1em 0; }
.warnings h2 { border: none; margin-top: 0.3em; color: #a04000; }
table { border-collapse: collapse; margin: 0.8em 0; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid #e5e5e5; padding: 0.25em 0.8em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
figure { margin: 1em 0 2em 0; } figcaption { color: #444; font-size: 0.92em; }
code { background: #f3f3f3; padding: 0 0.2em; border-radius: 3px; }
"""


def _text(value: str) -> str:
    """*value* escaped, its backquoted parts as ``<code>``."""
    parts = value.split("`")
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p) for i, p in enumerate(parts))


def _table(table: Table) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in table.header)
    body = "".join("<tr>" + "".join(f"<td>{_text(str(c))}</td>" for c in row) + "</tr>" for row in table.rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _plot(plot: Plot, first: bool) -> str:
    div = plot.figure.to_html(
        full_html=False, include_plotlyjs=first, include_mathjax=False, div_id=plot.div_id, config=PLOT_CONFIG,
    )
    caption = f"<figcaption>{_text(plot.caption)}</figcaption>" if plot.caption else ""
    return f'<figure id="figure-{html.escape(plot.div_id)}">{div}{caption}</figure>'


def render_page(page: Page) -> str:
    """The page as HTML text (see the module docstring).

    Raises
    ------
    ValueError
        Two figures share a ``div_id``.
    """
    ids = [p.div_id for s in page.sections for p in s.plots]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise ValueError(f"figure ids must be unique on a page; repeated: {', '.join(repeated)}")
    out = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(page.title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(page.title)}</h1>",
    ]
    if page.subtitle:
        out.append(f'<p class="subtitle">{_text(page.subtitle)}</p>')
    if page.warnings:
        items = "".join(f"<li>{_text(w)}</li>" for w in page.warnings)
        out.append(f'<section class="warnings" id="warnings"><h2>Warnings ({len(page.warnings)})</h2><ul>{items}</ul></section>')
    first = True
    for section in page.sections:
        out.append(f"<section><h2>{html.escape(section.title)}</h2>")
        out += [f"<p>{_text(n)}</p>" for n in section.notes]
        if section.table is not None:
            out.append(_table(section.table))
        for plot in section.plots:
            out.append(_plot(plot, first))
            first = False
        out.append("</section>")
    out.append("</body></html>\n")
    return "\n".join(out)


def write_page(page: Page, path: str | Path) -> Path:
    """Write :func:`render_page` of *page* to *path* (UTF-8; its directory made if need be); return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_page(page), encoding="utf-8")
    return out
