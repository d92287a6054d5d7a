"""models.storage.writer, the one writer of every output file (issue 38 item 1): a link at the target is
replaced, never written through; a failure mid-write leaves the old file and no temporary file."""

import json
import os
import stat

import pytest

from models.storage import writer
from models.storage.paths import PathRefused


def listing(directory):
    return sorted(p.name for p in directory.iterdir())


def linked_run(tmp_path, name: str, victim_name: str):
    """(tmp_path/run holding a link `name` to ../victim_name, that victim file, "precious")."""
    victim = tmp_path / victim_name
    victim.write_text("precious")
    run = tmp_path / "run"
    run.mkdir()
    (run / name).symlink_to(f"../{victim_name}")
    return run, victim


def test_a_link_at_the_target_is_replaced_and_its_target_left_alone(tmp_path):
    run, victim = linked_run(tmp_path, "circuit.csv", "victim.txt")
    writer.write_text(run / "circuit.csv", "edge,score\n")
    assert victim.read_text() == "precious"
    assert not (run / "circuit.csv").is_symlink() and (run / "circuit.csv").read_text() == "edge,score\n"
    assert listing(run) == ["circuit.csv"]


def test_a_link_to_a_directory_and_a_dangling_link_are_replaced(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "kept").write_text("x")
    run = tmp_path / "run"
    run.mkdir()
    (run / "a.json").symlink_to(elsewhere)
    (run / "b.json").symlink_to(tmp_path / "missing")
    writer.write_json(run / "a.json", {"a": 1})
    writer.write_json(run / "b.json", {"b": 2})
    assert listing(elsewhere) == ["kept"] and not (tmp_path / "missing").exists()
    assert json.loads((run / "a.json").read_text()) == {"a": 1} and not (run / "a.json").is_symlink()
    assert json.loads((run / "b.json").read_text()) == {"b": 2} and not (run / "b.json").is_symlink()


def test_a_fill_that_writes_by_name_gets_the_targets_name_and_never_the_target(tmp_path):
    target = tmp_path / "report.png"
    target.symlink_to(tmp_path / "victim.png")
    (tmp_path / "victim.png").write_bytes(b"old")
    seen = []

    def fill(tmp):   # as plotly's write_image: the format from the suffix, the file by name
        seen.append(tmp)
        with open(tmp, "wb") as handle:
            handle.write(b"new")

    writer.write_file(target, fill)
    assert os.path.basename(seen[0]) == "report.png" and os.path.dirname(seen[0]) != str(tmp_path)
    assert (tmp_path / "victim.png").read_bytes() == b"old" and target.read_bytes() == b"new"
    assert listing(tmp_path) == ["report.png", "victim.png"]


@pytest.mark.parametrize("failure", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_a_failure_mid_write_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path, failure):
    target = tmp_path / "weights.safetensors"
    target.write_bytes(b"old weights")

    def failing(tmp):
        with open(tmp, "wb") as handle:
            handle.write(b"half of the new")
        raise failure

    with pytest.raises(type(failure)):
        writer.write_file(target, failing)
    assert target.read_bytes() == b"old weights"
    assert listing(tmp_path) == ["weights.safetensors"]


def test_a_killed_writer_leaves_only_a_leftover_that_remove_leftovers_removes(tmp_path):
    target = tmp_path / "config.json"
    target.write_text("{}")
    pid = os.fork()
    if pid == 0:   # the child dies in the middle of the write
        try:
            writer.write_file(target, lambda tmp: (open(tmp, "wb").write(b"{\"half"), os._exit(0)))
        finally:
            os._exit(1)
    os.waitpid(pid, 0)
    assert target.read_text() == "{}"
    leftovers = writer.leftovers(tmp_path, "config.json")
    assert len(leftovers) == 1 and leftovers[0].is_dir()
    writer.remove_leftovers(tmp_path, "config.json")
    assert listing(tmp_path) == ["config.json"]


def test_a_directory_at_the_target_is_refused_in_one_line(tmp_path):
    (tmp_path / "out.csv").mkdir()
    with pytest.raises(PathRefused, match=r"out.csv is a directory; refusing to replace it") as refused:
        writer.write_text(tmp_path / "out.csv", "x")
    assert "\n" not in str(refused.value) and listing(tmp_path) == ["out.csv"]


def test_a_fill_that_writes_nothing_or_a_link_is_refused(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    with pytest.raises(PathRefused, match="nothing was written for"):
        writer.write_file(tmp_path / "a", lambda tmp: None)
    with pytest.raises(PathRefused, match="left a link"):
        writer.write_file(tmp_path / "b", lambda tmp: os.symlink(victim, tmp))
    assert listing(tmp_path) == ["victim"] and victim.read_text() == "precious"


def test_hard_links_keep_the_old_content_and_permissions_follow_the_umask(tmp_path):
    target, other = tmp_path / "metrics.json", tmp_path / "other-name"
    target.write_text("old")
    os.link(target, other)
    writer.write_bytes(target, b"n", memoryview(b"ew"))
    assert target.read_text() == "new" and other.read_text() == "old"
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask


def test_copy_file_copies_a_regular_file_and_refuses_a_link_as_source(tmp_path):
    source = tmp_path / "model.safetensors"
    source.write_bytes(bytes(range(256)) * 1000)
    writer.copy_file(source, tmp_path / "copy")
    assert (tmp_path / "copy").read_bytes() == source.read_bytes()
    (tmp_path / "link").symlink_to(source)
    with pytest.raises(PathRefused, match="is a symbolic link"):
        writer.copy_file(tmp_path / "link", tmp_path / "copy2")
    assert listing(tmp_path) == ["copy", "link", "model.safetensors"]


def test_a_scratch_write_without_fsync_is_as_confined(tmp_path, monkeypatch):
    """durable=False (a disk cache's activations) skips only the fsyncs: a link is still replaced."""
    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    (tmp_path / "victim").write_bytes(b"precious")
    (tmp_path / "hook_out.safetensors").symlink_to(tmp_path / "victim")
    writer.write_bytes(tmp_path / "hook_out.safetensors", b"activations", durable=False)
    assert synced == [] and (tmp_path / "victim").read_bytes() == b"precious"
    assert (tmp_path / "hook_out.safetensors").read_bytes() == b"activations"
    writer.write_bytes(tmp_path / "cache.json", b"{}")
    assert len(synced) == 2   # the file, then its directory


def test_write_files_moves_what_fill_wrote_and_replaces_links_without_following_them(tmp_path):
    run, victim = linked_run(tmp_path, "tokenizer.json", "victim.json")

    def fill(tmp):
        for name, text in (("tokenizer.json", "{}"), ("tokenizer_config.json", '{"a": 1}')):
            with open(os.path.join(tmp, name), "w") as handle:
                handle.write(text)

    written = writer.write_files(run, fill, "tokenizer")
    assert written == [run / "tokenizer.json", run / "tokenizer_config.json"]
    assert victim.read_text() == "precious" and not (run / "tokenizer.json").is_symlink()
    assert (run / "tokenizer.json").read_text() == "{}" and listing(run) == ["tokenizer.json", "tokenizer_config.json"]


@pytest.mark.parametrize("make, message", [
    (lambda tmp: os.symlink("/etc/hostname", os.path.join(tmp, "tokenizer.json")), "left a link"),
    (lambda tmp: os.mkdir(os.path.join(tmp, "sub")), "something else than a regular file"),
    (lambda tmp: None, "nothing was written for tokenizer"),
])
def test_write_files_refuses_links_and_directories_before_moving_anything(tmp_path, make, message):
    run = tmp_path / "run"
    run.mkdir()
    (run / "kept.json").write_text("old")

    def fill(tmp):
        with open(os.path.join(tmp, "a.json"), "w") as handle:
            handle.write("new")
        make(tmp)
        if message.startswith("nothing"):
            os.remove(os.path.join(tmp, "a.json"))

    with pytest.raises(PathRefused, match=message):
        writer.write_files(run, fill, "tokenizer")
    assert listing(run) == ["kept.json"] and not writer.leftovers(run, "tokenizer")
