"""How a report carries plotly.js (4.8 MB minified) and stays offline: two modes.

    embed      (the default) plotly.js gzip-compressed and base64-encoded inside the page: one
               self-contained file (about 1.96 MB plus the data) that can be mailed or moved alone.
               The browser inflates it with DecompressionStream when the page opens (Chrome/Edge 80+,
               Firefox 113+, Safari 16.4+), then draws the figures.
    directory  the page loads plotly-VERSION.min.js from its own directory, written there by the
               first report that needs it and shared by every later one: a report is only its data
               (tens of KB), the directory holds 4.8 MB once. Move the report with that file.

    choose(mode=None) -> str                 mode, else $INTERP_PLOTLYJS, else "embed"
    loader(mode) -> str                      the <script> the report's <head> gets
    figure(fig, div_id) -> str               the figure's <div> and its deferred drawing script
    write_shared(directory) -> Path          plotly-VERSION.min.js in `directory` (directory mode)

Either way the figures' scripts are inert (type text/x-interp-figure) until plotly.js is loaded;
the loader then runs them in order. When it cannot load plotly.js (no DecompressionStream, the
shared file missing) the page says so at its top and logs a console error; the tables and text
read as they are. Nothing is fetched from the network.
"""

from __future__ import annotations

import base64
import functools
import gzip
import json
import os
import stat
from pathlib import Path

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs, get_plotlyjs_version

from models.storage.writer import write_text

MODES = ("embed", "directory")
ENVIRONMENT = "INTERP_PLOTLYJS"
FIGURE_TYPE = "text/x-interp-figure"
PLOTLY_SCRIPT = "<script>"   # plotly escapes '<' inside the figure's JSON, so this is its own tag

# draw(): run the inert figure scripts once the document is parsed; fail(why): say so, visibly.
LOADER = """<script>
(function () {
  function ready(f) { if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', f); else f(); }
  function draw() {
    ready(function () {
      Array.prototype.forEach.call(document.querySelectorAll('script[type="%(type)s"]'), function (s) {
        var run = document.createElement('script'); run.text = s.text; s.parentNode.replaceChild(run, s); });
    });
  }
  function fail(why) {
    console.error('interp report: plotly.js could not be loaded: ' + why);
    ready(function () {
      var p = document.createElement('p'); p.id = 'plotlyjs-missing';
      p.style.cssText = 'background:#fee;border:1px solid #c00;padding:0.6em;';
      p.textContent = 'The figures of this report cannot be drawn: ' + why + '. The tables and text below are complete.';
      document.body.insertBefore(p, document.body.firstChild);
    });
  }
  %(load)s
})();
</script>"""

LOAD_EMBEDDED = """try {
    if (typeof DecompressionStream === 'undefined') throw new Error('this browser has no DecompressionStream ' +
        '(Chrome/Edge 80+, Firefox 113+, Safari 16.4+ have it)');
    var text = atob(%(data)s), bytes = new Uint8Array(text.length);
    for (var i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
    new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'))).text().then(function (source) {
      var s = document.createElement('script'); s.text = source; document.head.appendChild(s);
      if (typeof Plotly === 'undefined') throw new Error('the embedded plotly.js did not define Plotly');
      draw();
    }).catch(function (e) { fail(String(e && e.message || e)); });
  } catch (e) { fail(String(e && e.message || e)); }"""

LOAD_SHARED = """var s = document.createElement('script'); s.src = %(name)s; s.onload = draw;
  s.onerror = function () { fail(%(name)s + ' is not in the directory of this report (it holds plotly.js; ' +
                                  'copy it next to the report, or write the report with INTERP_PLOTLYJS=embed)'); };
  document.head.appendChild(s);"""


def choose(mode: str | None = None) -> str:
    """`mode`, else the environment variable INTERP_PLOTLYJS, else "embed"; ValueError otherwise."""
    chosen = mode if mode is not None else (os.environ.get(ENVIRONMENT) or "embed")
    if chosen not in MODES:
        source = "plotlyjs" if mode is not None else f"${ENVIRONMENT}"
        raise ValueError(f"{source} must be one of {', '.join(MODES)}; got {chosen!r}")
    return chosen


def shared_name() -> str:
    """The shared file's name: plotly-VERSION.min.js (reports of another plotly.js keep their own)."""
    return f"plotly-{get_plotlyjs_version()}.min.js"


@functools.cache
def _source() -> bytes:
    return get_plotlyjs().encode("utf-8")


@functools.cache
def compressed() -> str:
    """plotly.js, gzip (level 9, no timestamp: the same bytes every time), base64."""
    return base64.b64encode(gzip.compress(_source(), 9, mtime=0)).decode("ascii")


def loader(mode: str) -> str:
    """The <script> that loads plotly.js in mode `mode` (embed: the whole compressed library)."""
    if mode == "embed":
        load = LOAD_EMBEDDED % {"data": json.dumps(compressed())}
    elif mode == "directory":
        load = LOAD_SHARED % {"name": json.dumps(shared_name())}
    else:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    carried = "embedded, gzip + base64" if mode == "embed" else shared_name()
    comment = f"<!-- plotly.js v{get_plotlyjs_version()}: {carried} -->\n"
    return comment + LOADER % {"type": FIGURE_TYPE, "load": load}


def figure(fig: go.Figure, div_id: str) -> str:
    """The figure's <div> and its drawing script, inert until the loader runs it."""
    html = fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config={"displaylogo": False})
    if html.count(PLOTLY_SCRIPT) != 1:   # plotly's to_html changed its markup: fail here, not in a browser
        raise RuntimeError(f"plotly's to_html wrote {html.count(PLOTLY_SCRIPT)} {PLOTLY_SCRIPT!r} tags for one "
                           "figure, expected 1")
    return html.replace(PLOTLY_SCRIPT, f'<script type="{FIGURE_TYPE}">')


def write_shared(directory: str | os.PathLike) -> Path:
    """plotly-VERSION.min.js in `directory`: written (atomically) unless a regular file with the
    same bytes is there already; returns its path."""
    path = Path(directory) / shared_name()
    try:
        current = os.lstat(path)
    except FileNotFoundError:
        current = None
    if current is None or not stat.S_ISREG(current.st_mode) or current.st_size != len(_source()) \
            or path.read_bytes() != _source():
        write_text(path, get_plotlyjs())
    return path
