"""What the README, docs/ and the examples' docstrings cite exists: every repository path, every
dotted name of our packages, every `interp` command line's subcommand and flags, every extra; and
none of them points at a file outside the repository or a path of the machine it was written on.
(Links between pages are tests/test_readme.py's.)"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
import tomllib
from pathlib import Path

import pytest

from interp.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
TOP = ("docs", "examples", "benchmarks", "tests", "interp", "models", "probes", "results", ".ci")
PATH = re.compile(r"(?<![\w/.~-])((?:%s)/[\w./*{}<>-]*[\w*}>]/?)" % "|".join(re.escape(t) for t in TOP))
DOTTED = re.compile(r"(?<![\w./])((?:interp|models|probes)(?:\.[A-Za-z_]\w*)+)")
EXTRA = re.compile(r"\.\[([a-z][\w,-]+)\]|`\[([a-z][a-z-]+)\]`|\[([a-z][a-z-]+)\] extra")   # not a shape: `[64]`, `[m]`


def texts() -> list[tuple[str, str]]:
    """(name, text) of every page and every example's module docstring."""
    found = [(str(page.relative_to(ROOT)), page.read_text()) for page in PAGES]
    for example in EXAMPLES:
        found.append((str(example.relative_to(ROOT)), ast.get_docstring(ast.parse(example.read_text())) or ""))
    return found


CITED = texts()


def placeholder(path: str) -> bool:
    """A path written with a placeholder (NAME, {l}, *, KEY.safetensors) or an output the reader makes."""
    return bool(re.search(r"[A-Z]{2,}|[{}*<>]|\.\.\.", path))


@pytest.mark.parametrize("name, text", CITED, ids=[name for name, _ in CITED])
def test_cited_paths_exist(name, text):
    missing = [p for p in PATH.findall(text) if not placeholder(p) and not (ROOT / p.rstrip("/.")).exists()]
    assert not missing, f"{name} cites paths that do not exist: {sorted(set(missing))}"


def resolves(dotted: str) -> bool:
    """`dotted` names a module of ours or an attribute of one (the longest importable prefix, then getattr)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


@pytest.mark.parametrize("name, text", CITED, ids=[name for name, _ in CITED])
def test_cited_names_of_our_packages_resolve(name, text):
    code = " ".join(re.findall(r"`([^`]+)`", text)) + " ".join(re.findall(r"```.*?```", text, flags=re.S))
    names = {n.rstrip(".") for n in DOTTED.findall(code) if not n.endswith((".py", ".md"))}
    assert not [n for n in sorted(names) if not resolves(n)], f"{name}: names that do not resolve"


def subcommands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def command_lines(text: str) -> list[str]:
    """Every line of a ```bash block that runs `interp` (after `&&` too), comments cut."""
    lines = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            for part in line.split("#")[0].split("&&"):
                if part.strip().startswith("interp "):
                    lines.append(part.strip())
    return lines


@pytest.mark.parametrize("name, text", CITED, ids=[name for name, _ in CITED])
def test_cited_command_lines_use_real_subcommands_and_flags(name, text):
    parsers = subcommands()
    for line in command_lines(text):
        words = line.split()
        assert words[1] in parsers or words[1].startswith("-"), f"{name}: no subcommand {words[1]!r} in {line!r}"
        if words[1] in parsers:
            known = parsers[words[1]]._option_string_actions
            unknown = [w.split("=")[0] for w in words[2:] if w.startswith("--") and w.split("=")[0] not in known]
            assert not unknown, f"{name}: {line!r} uses flags `interp {words[1]}` does not have: {unknown}"


def test_cited_extras_exist():
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    for name, text in CITED:
        cited = {e for groups in EXTRA.findall(text) for group in groups if group for e in group.split(",")}
        assert cited <= extras, f"{name} cites extras pyproject.toml does not define: {sorted(cited - extras)}"


@pytest.mark.parametrize("name, text", CITED, ids=[name for name, _ in CITED])
def test_nothing_cited_lies_outside_the_repository(name, text):
    assert not re.search(r"SCIENCE\.md|\bshared/|/work/|/check/|/home/\w", text), \
        f"{name} cites a file outside the repository or a path of the machine it was written on"


def test_the_checks_see_what_they_look_for():
    assert PATH.findall("see `docs/drift.md` and examples/nothing.py, not runs/x") == ["docs/drift.md",
                                                                                       "examples/nothing.py"]
    assert not resolves("models.no_such_thing") and resolves("models.from_pretrained")
    assert command_lines("```bash\npip install x && interp eval RUN --n 4  # c\n```") == ["interp eval RUN --n 4"]
    assert EXTRA.findall('pip install -e ".[test,tl]"')[0][0] == "test,tl"
    assert EXTRA.findall("a state `[64]`, rows `[m]`") == []


SOURCE = re.compile(r"(?:benchmarks|examples)/[a-z_]+\.py|tests/test_[a-z_0-9]+\.py|(?:models|interp)/[a-z_/]+\.py|"
                    r"`?interp (?:demo|train|eval|drift|heads|patch|circuit|sweep|reproduce|sample-efficiency)\b|"
                    r"RESULTS\.md|cache_plan")
MEASURED = re.compile(r"\b\d+(?:\.\d+)?(?:e-?\d+)? ?(?:s|ms|min|GB|MB|GiB|MiB)\b|\b\d+(?:\.\d+)?x\b")


def measured_sections(text: str) -> list[tuple[str, list[str]]]:
    """(heading, figures) of every section (code blocks left out) stating a measured time, size or ratio
    without naming where it comes from (a benchmark, example, test, module or `interp` command)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    sections = re.split(r"\n(?=#+ )", text)
    return [(section.splitlines()[0], MEASURED.findall(section)) for section in sections
            if MEASURED.search(section) and not SOURCE.search(section)]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_measured_figure_names_the_script_that_regenerates_it(page):
    assert measured_sections(page.read_text()) == []


def test_the_measured_figure_check_sees_an_unsourced_number():
    assert measured_sections("## A\n\nIt takes 3.2 s.\n\n## B\n\n2.1x faster (`benchmarks/x.py`).\n") == \
        [("## A", ["3.2 s"])]
