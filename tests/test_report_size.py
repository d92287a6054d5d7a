"""A report's size is proportionate to its data (issue 40) and it still opens offline:
interp.report.plotlyjs. The default report embeds plotly.js gzip + base64 (one self-contained file,
about 1.96 MB, was 4.8 MB); INTERP_PLOTLYJS=directory shares one plotly-VERSION.min.js per directory.
Every report written here is opened in headless Chromium (tests/browser.py; skipped without it)."""

import base64
import gzip
import json
import os
import re

import plotly.graph_objects as go
import pytest
from plotly.offline import get_plotlyjs

from interp.report import plotlyjs
from interp.report.evaluation import accuracy_vs_length
from interp.report.html import Table, Text, render_report, write_report
from tests.browser import assert_renders, problems, render

SMALL_BOUND = 2_500_000       # bytes: a small report, plotly.js embedded (4.8 MB before issue 40)
SHARED_BOUND = 100_000        # bytes: the same report when plotly.js is shared by its directory


def small_sections():
    return [Text("a small report"), accuracy_vs_length({"m": {60: 1.0, 100: 0.9, 1000: 0.2}}, train_length=60),
            Table([{"length": 60, "accuracy": 1.0}]), go.Figure(go.Heatmap(z=[[0.1, 0.2], [0.3, 0.4]]))]


def embedded_source(text: str) -> bytes:
    """The plotly.js the page carries: its base64 string literal, un-base64ed and gunzipped."""
    literals = re.findall(r'atob\(("[A-Za-z0-9+/=]+")\)', text)
    assert len(literals) == 1, f"{len(literals)} embedded plotly.js blobs"
    return gzip.decompress(base64.b64decode(json.loads(literals[0])))


def test_a_small_report_is_bounded_self_contained_and_renders(tmp_path, monkeypatch):
    monkeypatch.delenv(plotlyjs.ENVIRONMENT, raising=False)
    path = write_report(tmp_path / "small.html", "small", small_sections())
    size = path.stat().st_size
    assert size < SMALL_BOUND, f"a small report is {size} bytes"
    assert list(tmp_path.iterdir()) == [path]                       # nothing beside it: self-contained
    text = path.read_text()
    assert not re.search(r"<script[^>]+src=", text) and "cdn." not in text     # nothing to fetch
    assert embedded_source(text) == get_plotlyjs().encode()         # the whole library, byte for byte
    summary = assert_renders(path)
    assert summary["expected_figures"] == 2
    assert [(f["rendered"], f["drawn"] >= 1) for f in summary["figures"]] == [(True, True)] * 2


def test_the_embedded_library_is_deterministic_and_a_report_without_figures_has_none():
    """The same bytes each time (gzip without a timestamp), so reruns of a report compare equal."""
    assert render_report("t", small_sections()) == render_report("t", small_sections())
    assert "atob(" not in render_report("t", [Text("no figure"), Table([{"a": 1}])])


def test_directory_mode_shares_one_library_file_per_directory(tmp_path, monkeypatch):
    monkeypatch.setenv(plotlyjs.ENVIRONMENT, "directory")
    first = write_report(tmp_path / "a.html", "a", small_sections())
    shared = tmp_path / plotlyjs.shared_name()
    assert shared.read_bytes() == get_plotlyjs().encode()
    before = shared.stat()
    second = write_report(tmp_path / "b.html", "b", small_sections())
    after = shared.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)   # reused, not rewritten
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["a.html", "b.html", shared.name])
    for path in (first, second):
        assert path.stat().st_size < SHARED_BOUND and "atob(" not in path.read_text()
        summary = assert_renders(path)
        assert all(f["rendered"] and f["drawn"] >= 1 for f in summary["figures"])


def test_a_stale_or_linked_shared_file_is_replaced_not_written_through(tmp_path):
    outside = tmp_path / "outside.js"
    outside.write_text("not plotly")
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / plotlyjs.shared_name()).symlink_to(outside)
    write_report(reports / "r.html", "r", small_sections(), plotlyjs="directory")
    assert outside.read_text() == "not plotly"
    assert not (reports / plotlyjs.shared_name()).is_symlink()
    assert (reports / plotlyjs.shared_name()).read_bytes() == get_plotlyjs().encode()
    (reports / plotlyjs.shared_name()).write_text("a truncated copy")
    write_report(reports / "s.html", "s", small_sections(), plotlyjs="directory")
    assert (reports / plotlyjs.shared_name()).read_bytes() == get_plotlyjs().encode()


def test_a_report_whose_library_cannot_load_says_so_and_fails_the_browser_check(tmp_path):
    """The browser check does not pass a page whose figures were never drawn: a corrupted embedded
    library, and a directory-mode report moved away from its shared file."""
    path = write_report(tmp_path / "broken.html", "broken", small_sections(), plotlyjs="embed")
    text = path.read_text()
    literal = re.search(r'atob\("([A-Za-z0-9+/=]+)"\)', text).group(1)
    path.write_text(text.replace(literal, literal[:1000] + "AAAA" + literal[1004:]))   # a corrupted gzip stream
    found = problems(render(path))
    assert any("plotly.js could not be loaded" in p for p in found), found
    assert sum("not rendered" in p for p in found) == 2, found

    moved = tmp_path / "moved"
    moved.mkdir()
    write_report(tmp_path / "shared.html", "shared", small_sections(), plotlyjs="directory")
    os.replace(tmp_path / "shared.html", moved / "shared.html")
    found = problems(render(moved / "shared.html"))
    assert any(plotlyjs.shared_name() in p and "is not in the directory" in p for p in found), found
    with pytest.raises(AssertionError, match="not rendered"):
        assert_renders(moved / "shared.html")


def test_the_mode_is_checked(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="plotlyjs must be one of embed, directory; got 'cdn'"):
        write_report(tmp_path / "r.html", "r", small_sections(), plotlyjs="cdn")
    monkeypatch.setenv(plotlyjs.ENVIRONMENT, "inline")
    with pytest.raises(ValueError, match=r"\$INTERP_PLOTLYJS must be one of embed, directory; got 'inline'"):
        write_report(tmp_path / "r.html", "r", small_sections())
    assert not (tmp_path / "r.html").exists()
