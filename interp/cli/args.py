"""Argument types shared by the subcommands: each parses one flag's text or names what is allowed."""

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


def fail(command: str, error: Exception | str) -> int:
    """Print `interp COMMAND: error: ...` to stderr; the exit status of a user error (2)."""
    print(f"interp {command}: error: {error}", file=sys.stderr)
    return 2
