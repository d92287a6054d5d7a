"""Every file the toolkit writes goes through models.storage.writer (issue 38 item 1): this scans the source
of the packages (interp, models, probes) for any other write and fails naming its file:line.

A write is: open() / Path.open() / io.open() with a mode that writes ("w", "a", "x", "+", or a mode
that is not a literal), os.open() with a flag that writes (O_WRONLY, O_RDWR, O_CREAT, O_TRUNC,
O_APPEND; a flags variable is read from its assignments in the same function), Path.write_text /
write_bytes, pandas to_csv / to_json / to_parquet / ... given a path, json.dump, numpy save / savez
/ savez_compressed / savetxt / tofile, torch.save, safetensors save_file / save_model, plotly
write_html / write_image, os.replace / os.rename / shutil.move and a path's .replace(x) /
.rename(x), shutil.copy* (copytree too), tempfile files, and truncate.

Not a write: anything inside models/storage/writer.py (the writer), and a call inside a lambda passed to
write_file (the writer's fill: it writes the temporary file the writer renames). The ALLOWED
functions below are the appenders and the lock, each with why it is not a replaced file."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("interp", "models", "probes")
WRITER = "models/storage/writer.py"

ALLOWED = {   # (file, function): why this write is not one the writer should make
    ("models/storage/paths.py", "open_appending"):
        "the appender: O_APPEND | O_NOFOLLOW, so a link at the file fails (metrics.jsonl, results.jsonl)",
    ("models/storage/paths.py", "_acquire"):
        "the lock file DIR/.interp.lock: opened O_NOFOLLOW and kept open to hold the flock, its pid in it",
    ("models/storage/paths.py", "_create_locked"):
        "renames a directory it has just made (with its lock held) into place: the run directory itself",
    ("interp/training/checkpoint.py", "open_metrics"):
        "truncates metrics.jsonl, opened by the appender, to the checkpoint's length on resume",
    ("interp/reproduce/results.py", "_snapshot"):
        "copytree into a staging directory it has just emptied, then renames that directory over the copy "
        "(a rename replaces a link, never its target)",
    ("interp/reproduce/results.py", "resume_unfinished"):
        "copytree into a run directory it has just removed (copytree makes the directory; it fails if it exists)",
}

WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND"}
PANDAS_WRITERS = {"to_csv", "to_json", "to_parquet", "to_pickle", "to_excel", "to_feather", "to_hdf", "to_stata"}
NUMPY_WRITERS = {"save", "savez", "savez_compressed", "savetxt"}
SHUTIL_WRITERS = {"copy", "copy2", "copyfile", "copyfileobj", "copytree", "move"}
TEMPFILE_WRITERS = {"mkstemp", "NamedTemporaryFile", "TemporaryFile", "SpooledTemporaryFile"}


def _flag_names(node: ast.AST) -> set[str]:
    names = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and n.attr.startswith("O_")}
    return names | {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                    and n.value.startswith("O_")}


def _writing_mode(mode: ast.AST | None) -> bool:
    if mode is None:
        return False
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return any(c in mode.value for c in "wax+")
    return True   # a mode computed at run time: count it


def _argument(call: ast.Call, index: int, keyword: str) -> ast.AST | None:
    found = [k.value for k in call.keywords if k.arg == keyword]
    return found[0] if found else call.args[index] if len(call.args) > index else None


class Writes(ast.NodeVisitor):
    """The writes of one module: [(line, what, enclosing function)]."""

    def __init__(self) -> None:
        self.scope: list[str] = []
        self.assigned: list[dict[str, set[str]]] = [{}]   # per function: variable -> the O_ flags assigned to it
        self.in_fill = 0
        self.found: list[tuple[int, str, str]] = []

    def visit_FunctionDef(self, node) -> None:
        assigned = {}
        for child in ast.walk(node):
            if isinstance(child, ast.Assign):
                for target in child.targets:
                    if isinstance(target, ast.Name):
                        assigned.setdefault(target.id, set()).update(_flag_names(child.value))
        self.scope.append(node.name)
        self.assigned.append(assigned)
        self.generic_visit(node)
        self.assigned.pop()
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        what = self.write_of(node)
        if what and not self.in_fill:
            self.found.append((node.lineno, what, self.scope[-1] if self.scope else "<module>"))
        if _callee(node) == "write_file":   # the fill lambdas write the writer's temporary file
            self.visit(node.func)
            for argument in [*node.args, *(k.value for k in node.keywords)]:
                self.in_fill += isinstance(argument, ast.Lambda)
                self.visit(argument)
                self.in_fill -= isinstance(argument, ast.Lambda)
            return
        self.generic_visit(node)

    def write_of(self, call: ast.Call) -> str | None:
        func, name = call.func, _callee(call)
        owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else None
        if name == "open" and owner == "os":
            flags = _argument(call, 1, "flags")
            names = _flag_names(flags) if flags is not None else set()
            for variable in (n.id for n in ast.walk(flags) if isinstance(n, ast.Name)) if flags is not None else ():
                names |= self.assigned[-1].get(variable, set())
            return "os.open for writing" if names & WRITE_FLAGS else None
        if name == "open":
            if isinstance(func, ast.Name) or owner == "io":
                return "open() for writing" if _writing_mode(_argument(call, 1, "mode")) else None
            return ".open() for writing" if _writing_mode(_argument(call, 0, "mode")) and (
                call.args and isinstance(call.args[0], ast.Constant) or any(k.arg == "mode" for k in call.keywords)) else None
        if name in ("write_text", "write_bytes") and isinstance(func, ast.Attribute) and owner != "writer":
            return f"Path.{name}"
        if name in PANDAS_WRITERS and (call.args or any(k.arg in ("path_or_buf", "path", "excel_writer")
                                                        for k in call.keywords)):
            return f"{name} to a path"
        if (name == "dump" and owner == "json") or (name == "save" and owner == "torch"):
            return f"{owner}.{name}"
        if (name in NUMPY_WRITERS and owner in ("np", "numpy")) or name == "tofile":
            return f"numpy {name}"
        if name in ("save_file", "save_model", "write_html", "write_image"):
            return name
        if (name in ("replace", "rename", "renames") and owner == "os") or (name == "move" and owner == "shutil"):
            return f"{owner}.{name}"
        if name in ("replace", "rename") and owner != "os" and len(call.args) == 1 and not call.keywords:
            return f"Path.{name}"
        if name in SHUTIL_WRITERS and owner == "shutil":
            return f"shutil.{name}"
        if name in TEMPFILE_WRITERS:
            return f"tempfile.{name}"
        if name == "truncate" and call.args:
            return "truncate"
        return None


def _callee(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def writes_outside_the_writer() -> list[str]:
    """'file:line: what (in function)' for every write the writer does not make and ALLOWED does not name."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative == WRITER:
                continue
            visitor = Writes()
            visitor.visit(ast.parse(path.read_text(encoding="utf-8"), filename=relative))
            found += [f"{relative}:{line}: {what} (in {function})" for line, what, function in visitor.found
                      if (relative, function) not in ALLOWED]
    return found


def test_every_write_goes_through_the_writer():
    stray = writes_outside_the_writer()
    assert not stray, ("writes outside models.storage.writer (route them through write_file / write_bytes / write_text / "
                       "write_json / copy_file, or add an ALLOWED entry saying why not):\n" + "\n".join(stray))


def test_the_scan_finds_each_kind_of_write():
    """The scan itself: each kind of write is found in a sample, and the writer's fill is not."""
    sample = '''
import json, os, shutil, tempfile
import numpy as np
import torch
from models.storage.writer import write_file

def writes(path, frame, fig, tensors, data, handle):
    open(path, "w")
    path.open("ab")
    os.open(path, os.O_WRONLY | os.O_CREAT)
    flags = os.O_RDWR
    os.open(path, flags)
    path.write_text("x")
    frame.to_csv(path)
    json.dump(data, handle)
    np.save(path, data)
    torch.save(data, path)
    fig.write_html(path)
    os.replace(path, path)
    path.rename(path)
    shutil.copyfile(path, path)
    tempfile.mkstemp()
    save_file(tensors, path)

def reads(path, frame, tensors, text):
    open(path)
    open(path, "rb")
    os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    frame.to_csv()
    json.dumps(text)
    text.replace("a", "b")
    write_file(path, lambda tmp: save_file(tensors, tmp))
'''
    visitor = Writes()
    visitor.visit(ast.parse(sample))
    assert [function for _, _, function in visitor.found] == ["writes"] * 15, visitor.found   # each line of writes()
