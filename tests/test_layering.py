"""The dependency rule of shared/DESIGN.md, read from the source: every import statement (at module
level or inside a function) of every module in models/, probes/ and interp/.

    models, probes  never import interp; neither imports the other
    interp          cli -> reproduce -> {report, sweep} -> analysis (and nnsight) -> training -> prompts -> tasks,
                    never back (prompts, text as Batches, sits with tasks, just above them);
                    rooms of one rank import neither each other (report never imports sweep, nor
                    sweep report; analysis never imports nnsight, nor nnsight analysis). The N*
                    search in analysis drives a runner it is handed (a sweep), so it needs no
                    import of sweep: the arrow points from sweep to analysis.
    a mixer file    imports only models.hooks, models.kernels, models.mixers (its base), models.config
                    and torch (the package's __init__ discovers the files: importlib, pkgutil)
    no two modules  import each other, even inside a function (a package and its own modules aside)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INTERP_RANK = {"tasks": 0, "prompts": 0.5, "training": 1, "analysis": 2, "nnsight": 2, "report": 3, "sweep": 3, "reproduce": 4,
               "cli": 5}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, module: str | None = None) -> set[str]:
    """Absolute names of every module `path` (the module `module`, default from its place under ROOT)
    imports, relative imports resolved."""
    module = module or module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from interp import cli`
    return names


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def top(name: str) -> str:
    return name.split(".")[0]


def interp_rank(name: str) -> int | None:
    parts = name.split(".")
    if parts[0] != "interp" or len(parts) < 2:
        return None
    return INTERP_RANK.get(parts[1])


def test_every_package_is_found():
    for package in ("models", "probes", "interp"):
        assert sources(package), package
    for room in INTERP_RANK:
        assert (ROOT / "interp" / room).exists() or (ROOT / "interp" / f"{room}.py").exists(), room


@pytest.mark.parametrize("package,forbidden", [("models", {"interp", "probes"}), ("probes", {"interp", "models"})])
def test_models_and_probes_import_neither_interp_nor_each_other(package, forbidden):
    bad = {str(p.relative_to(ROOT)): sorted(n for n in imports(p) if top(n) in forbidden) for p in sources(package)}
    assert not {k: v for k, v in bad.items() if v}


def room(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if parts[0] == "interp" and len(parts) > 1 and parts[1] in INTERP_RANK else None


def test_interp_imports_point_one_way():
    """A module in a room of rank r imports interp modules of rank < r, or of its own room."""
    bad = {}
    for path in sources("interp"):
        own = interp_rank(module_name(path))
        if own is None:  # interp/__init__.py
            continue
        mine = room(module_name(path))
        wrong = sorted(n for n in imports(path) if (rank := interp_rank(n)) is not None
                       and (rank > own or (rank == own and room(n) != mine)))
        if wrong:
            bad[str(path.relative_to(ROOT))] = wrong
    assert not bad


def test_mixer_files_import_only_hooks_kernels_and_torch():
    allowed = ("models.hooks", "models.hooks.state", "models.kernels", "models.mixers", "models.config", "torch", "__future__",
               "math", "dataclasses", "typing", "collections", "functools", "contextlib")
    bad = {}
    for path in sorted((ROOT / "models" / "mixers").glob("*.py")):
        if path.name == "__init__.py":
            continue
        wrong = sorted(n for n in imports(path) if not n.startswith(allowed) and n != "models")
        if wrong:
            bad[path.name] = wrong
    assert not bad


def test_the_checker_sees_a_violation(tmp_path):
    """The rule is not vacuous: a back-import (analysis -> report) is caught by the same reader."""
    fake = tmp_path / "probe.py"
    fake.write_text("def f():\n    from interp.report import html\n    from ..cli import args\n")
    found = imports(fake, "interp.analysis.probe")
    assert {"interp.report", "interp.report.html", "interp.cli", "interp.cli.args"} <= found
    assert max(interp_rank(n) or 0 for n in found) > INTERP_RANK["analysis"]


def test_peer_rooms_are_told_apart():
    """report and sweep share a rank, so the rule must compare rooms, not only ranks."""
    assert INTERP_RANK["report"] == INTERP_RANK["sweep"]
    assert room("interp.sweep.run") == "sweep" != room("interp.report.html")


# two-module circles still open, each with the file that owns it; a pair leaves this list when untied
OPEN_CIRCLES: set[tuple[str, str]] = set()   # (engine <-> results untied by interp/reproduce/plan.py, issue 40)


def import_graph() -> dict[str, set[str]]:
    """{module: the modules of models / probes / interp it imports} (a name resolved to its longest
    prefix that is a module: `from models.registry import save` is models.registry)."""
    paths = {module_name(p): p for package in ("models", "probes", "interp") for p in sources(package)}

    def resolve(name: str) -> str | None:
        parts = name.split(".")
        return next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in paths), None)

    return {module: {resolve(n) for n in imports(path)} - {None, module} for module, path in paths.items()}


def circles(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Pairs of modules that import each other, other than a package and one of its own modules."""
    pairs = {tuple(sorted((a, b))) for a, targets in graph.items() for b in targets if a in graph.get(b, set())}
    return {(a, b) for a, b in pairs if not (b.startswith(a + ".") or a.startswith(b + "."))}


def test_no_two_modules_import_each_other():
    found = circles(import_graph())
    assert found - OPEN_CIRCLES == set(), f"modules that import each other: {sorted(found - OPEN_CIRCLES)}"
    assert OPEN_CIRCLES <= found, f"untied, remove from OPEN_CIRCLES: {sorted(OPEN_CIRCLES - found)}"


def test_the_circle_check_sees_a_lazy_circle():
    graph = {"models.a": {"models.b"}, "models.b": {"models.a"}, "models": {"models.a"}, "models.c": {"models"}}
    assert circles(graph) == {("models.a", "models.b")}
    graph = import_graph()                 # the three circles of issue 28, untied at these ends
    assert "models.registry" not in graph["models.backbone"] and "models.storage.saving" in graph["models.backbone"]
    assert "models.kernels.diag_scan" not in graph["models.kernels.triton_diag_scan"]
    assert "interp.sweep.executors" not in graph["interp.sweep.ray_executor"]
    assert "interp.reproduce.engine" not in graph["interp.reproduce.results"]
