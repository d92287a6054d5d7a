"""The README as a newcomer meets it: each code block runs on its own, the shell lines in order.

Python blocks: each one runs in a fresh interpreter (nothing carried over from an earlier block),
from an empty directory. Shell lines: every line of the README's first ```bash block under "The
command line" (the one the README says is run) that starts with `interp` runs in the order given, from an empty directory (as in a fresh clone, where runs/ does
not exist yet), at tiny sizes: --steps N becomes max(2, N // 300) (so an extension stays one),
lengths become 8 and 16, evaluation sizes 16, models 8 wide.
"""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from interp.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# what each python block must leave true (appended to it), and print
CHECKS = {0: ("assert states.shape[:2] == (8, 20)", "max logit change from step 5 on:"),
          1: ("assert len(result.sites) == 12", "examples kept"),
          2: ("assert estimate.labels == exact.labels and lens.shape[0] == 3", "attribution vs exact, same rows: True"),
          3: ("assert len(prompts) == 33 and estimate.labels == exact.labels and circuit.scores.numel() > 0", "n_kept")}


def prepare(index: int, directory: Path) -> None:
    """What a block reads, written into its directory: the prompt block's checkpoint (a tiny GPT-2)."""
    if index == 3:
        from tests.prompt_fixtures import checkpoint_dir

        checkpoint_dir(directory / "path" / "to" / "gpt2")


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_the_blocks_the_tests_check():
    assert len(python_blocks()) == len(CHECKS)


@pytest.mark.parametrize("index", sorted(CHECKS))
def test_readme_python_block_runs_on_its_own(index, tmp_path):
    check, printed = CHECKS[index]
    prepare(index, tmp_path)
    source = python_blocks()[index] + "\n" + check + "\n"
    done = subprocess.run([sys.executable, "-c", source], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "TRITON_INTERPRET": "1"},
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert printed in done.stdout


TINY = {"train": ["--batch-size", "4", "--d-model", "8", "--eval-every", "2", "--no-progress"],
        "eval": ["--n", "16"], "drift": ["--n", "16", "--n-fit", "32", "--n-drift", "8"], "heads": ["--n", "16"],
        "patch": ["--n", "16"]}


def tiny(argv: list[str]) -> list[str]:
    out = []
    for flag, value in zip(argv, argv[1:] + [""]):
        if out and out[-1] in ("--steps", "--train-length", "--lengths"):
            out.append({"--steps": str(max(2, int(flag) // 300)) if flag.isdigit() else flag,
                        "--train-length": "8", "--lengths": "8,16"}[out[-1]])
        else:
            out.append(flag)
    return out + TINY.get(argv[0], [])


def test_readme_shell_lines_run_in_order_from_a_fresh_clone(tmp_path, monkeypatch, capsys):
    section = README.read_text().split("## The command line", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    lines = [line.split("  #")[0].strip() for line in block.splitlines() if line.startswith("interp ")]
    assert any(line.startswith("interp heads runs/repl-deltanet") for line in lines)
    monkeypatch.chdir(tmp_path)
    for line in lines:
        argv = tiny(shlex.split(line)[1:])
        assert main(argv) == 0, (line, argv, capsys.readouterr().err)
    config = (tmp_path / "runs" / "s3-tanh" / "config.json").read_text()
    assert '"to_steps": 6' in config  # the extension line extended the run


def test_readme_opens_with_the_two_commands():
    lines = [line for line in README.read_text().splitlines() if line.startswith("pip install")]
    assert "interp demo" in lines[0] and "pytest" in lines[1]
    assert Path(README.parent / ".ci/run").read_text().count("python -m pytest -q -n 2 tests") == 1


def relative_links(path: Path) -> list[tuple[str, str]]:
    """(target file, anchor) of every markdown link in `path` that is not a URL (code left out)."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    text = re.sub(r"`[^`]*`", "", re.sub(r"^    .*$", "", text, flags=re.M))
    found = re.findall(r"\]\(([^)\s]+)\)", text)
    return [tuple((link.split("#", 1) + [""])[:2]) for link in found if not re.match(r"[a-z]+:", link)]


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of the headings of a markdown file."""
    heads = re.findall(r"^#+ (.+)$", path.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("page", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: str(p.relative_to(ROOT)))
def test_links_stay_inside_the_repository_and_resolve(page):
    """The README and every docs page link only to files of this repository that exist (and to headings
    that exist), never to the design notes outside it."""
    text = page.read_text()
    assert "SCIENCE.md" not in text and "shared/" not in text, f"{page.name} cites a file outside the repository"
    for target, anchor in relative_links(page):
        resolved = (page.parent / target).resolve() if target else page
        assert resolved.exists() and ROOT in resolved.parents, f"{page.name}: broken link {target}"
        if anchor and resolved.suffix == ".md":
            assert anchor in anchors(resolved), f"{page.name}: no heading #{anchor} in {resolved.name}"


def test_every_docs_page_is_listed_in_the_index():
    index = (ROOT / "docs" / "README.md").read_text()
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert {p for p in pages if f"]({p})" not in index} == set()


def test_the_readme_defines_its_words():
    text = README.read_text()
    assert "docs/README.md" in text
    glossary = (ROOT / "docs" / "README.md").read_text()
    for word in ("**seed claim**", "**the paper's reading**"):
        assert word in glossary
    for term in ("mp is", "Tcross the first step", "seed claim (a sentence"):
        assert term in text, term


def test_the_nnsight_page_runs(tmp_path):
    pytest.importorskip("nnsight")
    source = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "nnsight.md").read_text(), flags=re.S)[0]
    script = tmp_path / "nnsight_page.py"     # nnsight reads a trace's source back from its file
    script.write_text(source + "\nassert patched.shape == logits.shape and states.shape[:2] == (8, 12)\n"
                      "assert not torch.equal(patched, logits)\nprint('ok')\n")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=600)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
