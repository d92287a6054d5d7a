"""Open an HTML report in headless Chromium (network disabled) and check what a reader would see:
every plotly graph rendered (each axis of its layout drawn: plotly.js drops a subplot no trace
uses), no JavaScript error, no scatter text label cut off (wholly inside its plot area, or inside
the figure where the trace has cliponaxis false), and every axis the browser drew holds its data (log axes in log10 units)
without reaching more than a decade past it.

    assert_renders(path)      call it in every test that writes a report; skips without Chromium
    render(path) -> dict      what the page reported: {"errors": [...], "figures": [...]}

How: a copy of the page gets two small scripts, one first in <head> that records errors (window
error events, unhandled rejections, console.error), one last in <body> that waits until every
.plotly-graph-div has been drawn (or 5 s of virtual time), then writes a JSON summary into a <pre>
that `chromium --dump-dom` prints. Chromium's own console log (stderr) is scanned for uncaught
errors as well. The report file itself is not changed; the copy lies in a temporary directory with
the shared plotly-VERSION.min.js the report loads (INTERP_PLOTLYJS=directory), where one lies next
to the report. A figure counts as rendered when plotly drew its SVG (a .main-svg in its div) and,
when it has visible traces, at least one of them in it (a .trace, a heatmap's .hm, a .table).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
DIVS = re.compile(r'<div id="[^"]+" class="plotly-graph-div"')
SHARED = re.compile(r'"(plotly-[0-9A-Za-z.+-]+\.min\.js)"')

ERRORS_JS = """<script>
window.__interpErrors = [];
window.addEventListener('error', function (e) { window.__interpErrors.push('error: ' + (e.message || e)); });
window.addEventListener('unhandledrejection', function (e) { window.__interpErrors.push('rejection: ' + e.reason); });
(function () { var original = console.error; console.error = function () {
  window.__interpErrors.push('console.error: ' + Array.prototype.join.call(arguments, ' '));
  return original.apply(console, arguments); }; })();
</script>"""

SUMMARY_JS = """<script>
(function () {
  function extent(values, log) {
    var lo = Infinity, hi = -Infinity, bad = 0;
    (function walk(v) {
      if (v == null) return;
      if (typeof v === 'object' && typeof v.length === 'number' && typeof v !== 'string') {
        for (var i = 0; i < v.length; i++) walk(v[i]); return; }
      if (typeof v !== 'number' || !isFinite(v)) return;
      if (log) { if (v <= 0) { bad++; return; } v = Math.log10(v); }
      lo = Math.min(lo, v); hi = Math.max(hi, v);
    })(values);
    return {lo: lo === Infinity ? null : lo, hi: hi === -Infinity ? null : hi, nonpositive: bad};
  }
  function summary(g) {
    var full = g._fullLayout, axes = {};
    if (!full) return {id: g.id, rendered: false, axes: axes};
    Object.keys(full).filter(function (k) { return /^[xy]axis\\d*$/.test(k); }).forEach(function (k) {
      var ax = full[k], ref = k[0] + k.slice(5), data = [];
      (g._fullData || []).forEach(function (t) {
        if (t.visible !== true || ['scatter', 'bar', 'scattergl'].indexOf(t.type) < 0) return;
        if ((t[k[0] + 'axis'] || k[0]) !== ref) return;
        var values = t[k[0]];
        if (t.type === 'bar' && t.width != null && k[0] === 'x') return;   // widths extend the cells
        var valueAxis = (t.orientation === 'h') ? 'x' : 'y';
        if (t.type === 'bar' && t.base != null && k[0] === valueAxis && values) {   // bars: base .. base + value
          var base = t.base;
          values = Array.prototype.map.call(values, function (v, i) {
            return v + (typeof base === 'number' ? base : base[i]); });
          data.push(base);
        }
        data.push(values);
      });
      axes[k] = {type: ax.type, range: ax.range, data: extent(data, ax.type === 'log')};
    });
    var declared = Object.keys(g.layout || {}).filter(function (k) { return /^[xy]axis\\d*$/.test(k); });
    var visible = (g._fullData || []).filter(function (t) { return t.visible === true; }).length;
    return {id: g.id, rendered: g.querySelectorAll('.main-svg').length > 0, axes: axes, declared: declared,
            cut: cutLabels(g), visible: visible,
            drawn: g.querySelectorAll('.main-svg .trace, .main-svg .hm, .main-svg .table').length};
  }
  function cutLabels(g) {   // scatter text labels not wholly inside the plot area (or the svg, cliponaxis false)
    var svg = g.querySelector('.main-svg'), cut = [];
    if (!svg) return cut;
    var page = svg.getBoundingClientRect();
    var areas = Array.prototype.map.call(g.querySelectorAll('.draglayer .nsewdrag'),
                                         function (r) { return r.getBoundingClientRect(); });
    function within(b, r) { return b.left >= r.left - 1 && b.right <= r.right + 1 && b.top >= r.top - 1 &&
                                   b.bottom <= r.bottom + 1; }
    Array.prototype.forEach.call(g.querySelectorAll('.scatterlayer .trace'), function (tr) {
      var d = tr.__data__, trace = d && d[0] && d[0].trace, clips = !trace || trace.cliponaxis !== false;
      Array.prototype.forEach.call(tr.querySelectorAll('.textpoint text'), function (el) {
        var b = el.getBoundingClientRect();
        if (!b.width) return;
        var ok = clips && areas.length ? areas.some(function (r) { return within(b, r); }) : within(b, page);
        if (!ok) cut.push(el.textContent);
      });
    });
    return cut;
  }
  function finish() {
    var graphs = Array.prototype.slice.call(document.querySelectorAll('.plotly-graph-div'));
    var pre = document.createElement('pre');
    pre.id = 'interp-browser-summary';
    pre.textContent = JSON.stringify({errors: window.__interpErrors || [], figures: graphs.map(summary)});
    document.body.appendChild(pre);
  }
  var started = Date.now();
  function poll() {
    var graphs = Array.prototype.slice.call(document.querySelectorAll('.plotly-graph-div'));
    var done = graphs.every(function (g) { return g._fullLayout && g.querySelectorAll('.main-svg').length; });
    if (done || Date.now() - started > 5000) finish(); else setTimeout(poll, 50);
  }
  window.addEventListener('load', function () { setTimeout(poll, 0); });
})();
</script>"""


def chromium() -> str | None:
    """The Chromium executable, or None."""
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def render(path: str | Path, timeout: float = 90.0) -> dict:
    """Load a copy of the report in headless Chromium without network; the page's summary."""
    exe = chromium()
    if exe is None:
        pytest.skip("no Chromium found (Debian: apt-get install chromium)")
    text = Path(path).read_text()
    if "<head>" not in text or "</body>" not in text:
        raise AssertionError(f"{path} is not a full HTML page (no <head> or </body>)")
    probe = text.replace("<head>", "<head>" + ERRORS_JS, 1)
    probe = probe[: probe.rindex("</body>")] + SUMMARY_JS + probe[probe.rindex("</body>"):]
    with tempfile.TemporaryDirectory(prefix="interp-browser-") as tmp:
        page = Path(tmp) / "page.html"
        page.write_text(probe)
        for name in set(SHARED.findall(text)):
            if (Path(path).parent / name).is_file():
                shutil.copyfile(Path(path).parent / name, Path(tmp) / name)
        command = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                   "--no-first-run", "--disable-extensions", "--disable-background-networking",
                   "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
                   f"--user-data-dir={tmp}/profile", "--enable-logging=stderr", "--v=0",
                   "--virtual-time-budget=20000", "--dump-dom", page.as_uri()]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    match = re.search(r'<pre id="interp-browser-summary">(.*?)</pre>', done.stdout, re.S)
    if match is None:
        raise AssertionError(f"Chromium printed no page summary for {path} (exit {done.returncode}); "
                             f"stderr tail:\n{done.stderr[-2000:]}")
    import html

    summary = json.loads(html.unescape(match.group(1)))
    summary["console"] = [line for line in done.stderr.splitlines()
                          if "CONSOLE" in line and re.search(r"Uncaught|Error", line)]
    summary["expected_figures"] = len(DIVS.findall(text))
    return summary


def problems(summary: dict) -> list[str]:
    """What is wrong with a rendered page (empty when nothing is)."""
    out = [f"JavaScript: {e}" for e in summary["errors"]] + [f"console: {line}" for line in summary["console"]]
    figures = summary["figures"]
    if len(figures) != summary["expected_figures"]:
        out.append(f"{summary['expected_figures']} figures in the HTML, {len(figures)} graph divs in the page")
    for fig in figures:
        if not fig["rendered"]:
            out.append(f"{fig['id']}: not rendered")
        elif fig.get("visible") and not fig.get("drawn"):     # an SVG, but none of the data in it
            out.append(f"{fig['id']}: rendered, but none of its {fig['visible']} visible traces was drawn")
        for label in fig.get("cut", []):
            out.append(f"{fig['id']}: the text label {label!r} is cut off at the edge of the plot")
        undrawn = sorted(set(fig.get("declared", [])) - set(fig["axes"]))
        if undrawn:      # plotly.js draws no subplot that no trace uses: an empty panel vanishes
            out.append(f"{fig['id']}: axes {undrawn} are in the layout but were not drawn (a subplot without traces)")
        for name, ax in fig["axes"].items():
            data, drawn = ax["data"], ax["range"]
            if ax["type"] not in ("linear", "log") or data["lo"] is None or not drawn:
                continue
            lo, hi = sorted(float(v) for v in drawn)
            units = "log10 " if ax["type"] == "log" else ""
            slack = 1e-6 * max(1.0, abs(lo), abs(hi))
            if data["lo"] < lo - slack or data["hi"] > hi + slack:
                out.append(f"{fig['id']} {name}: draws {units}[{lo:.4g}, {hi:.4g}], data {units}"
                           f"[{data['lo']:.4g}, {data['hi']:.4g}]")
            if ax["type"] == "log" and (lo < data["lo"] - 1 or hi > data["hi"] + 1):
                out.append(f"{fig['id']} {name}: log axis drawn 10^{lo:.3g}..10^{hi:.3g} for data "
                           f"10^{data['lo']:.3g}..10^{data['hi']:.3g}")
            if data["nonpositive"]:
                out.append(f"{fig['id']} {name}: {data['nonpositive']} non-positive values on a log axis")
    return out


def assert_renders(path: str | Path) -> dict:
    """Every plotly graph of the report at `path` rendered in Chromium, with no JavaScript error and
    its data inside the drawn axes; skips when no Chromium is installed. Returns the summary."""
    summary = render(path)
    found = problems(summary)
    assert not found, f"{path} in Chromium:\n" + "\n".join(found)
    return summary
