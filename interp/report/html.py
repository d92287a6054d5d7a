"""Self-contained offline HTML reports.

    write_report(path, title, [Text(...), Table(rows), fig, ...]) -> Path

Sections are plotly figures, `Text` (escaped paragraphs, or `Text(html, raw=True)`) and `Table`
(a list of row dicts). The report opens without a network connection: plotly.js is embedded once,
compressed (the default, one self-contained file), or shared by the reports of a directory
(plotlyjs="directory", or INTERP_PLOTLYJS=directory): interp.report.plotlyjs. Written atomically.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from interp.report import plotlyjs as plotly_js
from models.storage.writer import write_text

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 1.6em; }
div.table-wrap { overflow-x: auto; margin: 1em 0; }
table.data { border-collapse: collapse; }
table.data th, table.data td { border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: right; }
table.data th { background: #f3f3f3; }
table.prose td { text-align: left; vertical-align: top; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; }
"""


@dataclass
class Text:
    """A paragraph (escaped) or, with raw=True, an HTML fragment; `heading` adds an <h2>."""

    body: str
    heading: str | None = None
    raw: bool = False


@dataclass
class Table:
    """Rows (dicts) rendered as an HTML table; columns in first-seen order. prose: the cells are
    sentences (left-aligned, top) rather than numbers (right-aligned)."""

    rows: Sequence[Mapping[str, Any]]
    heading: str | None = None
    prose: bool = False
    console: tuple[str, ...] = ()   # columns `interp reproduce` also prints (text_table); none: not printed


def render_table(rows: Sequence[Mapping[str, Any]], prose: bool = False) -> str:
    columns = list(dict.fromkeys(key for row in rows for key in row))
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(row.get(c, '')))}</td>" for c in columns) + "</tr>"
        for row in rows
    )
    return (f'<div class="table-wrap"><table class="data{" prose" if prose else ""}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{body}</tbody></table></div>')


def text_table(table: Table) -> str:
    """The `console` columns of `table` as fixed-width text under the heading's first sentence."""
    cells = [[_fmt(row.get(c, "")) if row.get(c) is not None else "-" for c in table.console] for row in table.rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(table.console)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(table.console, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join([(table.heading or "").split(". ")[0]] + ["    " + line.rstrip() for line in lines])


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value + 0.0:.4g}"          # + 0.0: a negative zero is written 0, not -0
    return str(value)


def render_report(title: str, sections: Sequence[go.Figure | Text | Table], plotlyjs: str = "embed") -> str:
    """The report as one HTML string; plotlyjs: "embed" (plotly.js inside, compressed) or "directory"
    (the page loads the shared file write_report puts next to it); none when no section is a figure."""
    plotlyjs = plotly_js.choose(plotlyjs)
    parts = []
    for index, section in enumerate(sections):
        if isinstance(section, go.Figure):
            parts.append(plotly_js.figure(section, f"figure-{index}"))
        elif isinstance(section, Text):
            heading = f"<h2>{html.escape(section.heading)}</h2>" if section.heading else ""
            body = section.body if section.raw else "".join(
                f"<p>{html.escape(p)}</p>" for p in section.body.split("\n\n") if p.strip())
            parts.append(heading + body)
        elif isinstance(section, Table):
            heading = f"<h2>{html.escape(section.heading)}</h2>" if section.heading else ""
            parts.append(heading + render_table(section.rows, section.prose))
        else:
            raise TypeError(f"sections[{index}] must be a go.Figure, Text or Table; got {type(section).__name__}")
    figures = any(isinstance(section, go.Figure) for section in sections)
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{STYLE}</style>"
            + (plotly_js.loader(plotlyjs) if figures else "") + "</head>"
            f"<body><h1>{html.escape(title)}</h1>\n" + "\n".join(parts) + "\n</body></html>\n")


def write_report(path: str | Path, title: str, sections: Sequence[go.Figure | Text | Table],
                 plotlyjs: str | None = None) -> Path:
    """Write the report to `path` atomically; returns the path. plotlyjs: "embed" or "directory"
    (default: $INTERP_PLOTLYJS, else "embed"); "directory" also writes plotly-VERSION.min.js next to
    the report unless it is there already."""
    path = Path(path)
    plotlyjs = plotly_js.choose(plotlyjs)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = render_report(title, sections, plotlyjs)
    if plotlyjs == "directory" and any(isinstance(section, go.Figure) for section in sections):
        plotly_js.write_shared(path.parent)
    write_text(path, text)
    return path
