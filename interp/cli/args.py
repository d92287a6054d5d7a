"""Argument types shared by the subcommands (each parses one flag's text or names what is allowed),
the parser class (a user error is one line on stderr, exit status 2) and the help formatter (every
flag shows its default; "{models}" / "{tasks}" in a help text list the choices, looked up only
when help is printed, so that building the parser stays free of heavy imports)."""

from __future__ import annotations

import argparse
import difflib
import sys


def checked_number(parse, allowed, what: str):
    """An argparse type: parse the text, keep it if allowed(value), else name what is allowed."""

    def check(text: str):
        try:
            value = parse(text)
        except ValueError:
            value = None
        if value is None or not allowed(value):
            raise argparse.ArgumentTypeError(f"must be {what}; got {text!r}")
        return value

    return check


positive_int = checked_number(int, lambda v: v >= 1, "a positive integer")
non_negative_int = checked_number(int, lambda v: v >= 0, "a non-negative integer")
positive_float = checked_number(float, lambda v: 0 < v < float("inf"), "a positive finite number")
non_negative_float = checked_number(float, lambda v: 0 <= v < float("inf"), "a non-negative finite number")
fraction = checked_number(float, lambda v: 0 <= v <= 1, "a number in [0, 1]")


def output_path(text: str):
    """--out: a non-empty path (pathlib.Path); argparse's Path would turn '' into '.'."""
    from pathlib import Path

    if not text.strip():
        raise argparse.ArgumentTypeError(f"must name a file or directory; got {text!r}")
    if "\0" in text:
        raise argparse.ArgumentTypeError(f"must not contain a NUL character; got {text!r}")
    return Path(text)


def check_out(command: str, out, file: bool = False) -> int | None:
    """Preflight of an --out directory (or, file=True, a report file; interp.training.preflight):
    None when it can be written, else the exit status of the one-line error `argument --out: ...`."""
    from interp.training.preflight import Refused, check_output_dir, check_output_file

    try:
        (check_output_file if file else check_output_dir)(out)
    except Refused as error:
        return fail(command, f"argument --out: {error}")
    return None


def length_list(text: str) -> list[int]:
    """'60,100,200' -> [60, 100, 200] (positive, comma-separated)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated positive integers like 60,100,200; got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"must be comma-separated positive integers like 60,100,200; got {text!r}")
    return sorted(set(values))


def model_name(text: str) -> str:
    import models

    names = models.list_models()
    if text not in names:
        close = difflib.get_close_matches(text, names, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise argparse.ArgumentTypeError(f"unknown model {text!r}{hint}; choose from {', '.join(names)}")
    return text


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: `interp train: error: ... (see --help)`."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown for every flag (unless its help already says what the default is), the
    description kept as written, and the choice placeholders filled in."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "{models}" in text or "{tasks}" in text:
            text = text.replace("{models}", ", ".join(_models())).replace("{tasks}", _tasks())
        if ("default" in text or action.default is None or action.default is False
                or action.default == argparse.SUPPRESS or not action.option_strings or action.nargs == 0):
            return text
        return f"{text} (default: %(default)s)"


def _models() -> list[str]:
    import models

    return models.list_models()


def _tasks() -> str:
    from interp.tasks import task_names

    return (f"{', '.join(task_names())}, or a group word problem: C<n>, Z<n>, S<k>, A<k> (k <= 6) and "
            "direct products such as A4xZ5")


def device_name(text: str) -> str:
    """A torch device that exists here (cpu, cuda:0, ...); else the available ones are named."""
    from models.devices import check_device

    try:
        check_device(text)
    except (ValueError, TypeError) as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("device ")) from None
    return text


def fail(command: str, error: Exception | str) -> int:
    """Print `interp COMMAND: error: ...` to stderr; the exit status of a user error (2)."""
    print(f"interp {command}: error: {error}", file=sys.stderr)
    return 2
