"""The sweep's tidy table: one row per finished trial, keyed by the trial's parameters.

    trial_id(params) -> "3f9c2a1b7d4e"     sha1 of the canonical JSON of the params (12 hex digits)
    ResultTable(out).append(row); .rows() -> {trial_id: row}; .frame() -> pandas.DataFrame

Rows live in out/results.jsonl, one JSON object per line, appended with a single write and fsync
as each trial finishes, so a killed sweep loses no finished trial; a torn line (a crash in the
middle of a write) is skipped with a warning when read, and its trial runs again. Failures of the latest run go to out/failures.jsonl
(rewritten atomically). `frame()` also writes out/results.parquet when pyarrow is installed.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from models.storage.paths import in_place_file, inside, open_appending, read_regular
from models.storage.writer import write_text

RESULTS, FAILURES = "results.jsonl", "failures.jsonl"
TIMING_COLUMNS = ("seconds", "wall_seconds", "attempts")   # columns that differ between identical runs


def canonical(params: Mapping[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)


def trial_id(params: Mapping[str, Any]) -> str:
    return hashlib.sha1(canonical(params).encode()).hexdigest()[:12]


class ResultTable:
    def __init__(self, out: str | Path) -> None:
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.path = self.out / RESULTS

    def rows(self) -> dict[str, dict]:
        """{trial_id: row} of every finished trial (the last row wins for a repeated id)."""
        path = inside(self.out, RESULTS)
        if not os.path.lexists(path):
            return {}
        found, torn = {}, 0
        text = read_regular(path).decode("utf-8", errors="replace")   # a link or a FIFO there: PathRefused
        for number, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:   # a line torn by a killed writer: that trial runs again
                torn += 1
                continue
            if not isinstance(row, dict) or not isinstance(row.get("trial_id"), str):
                raise ValueError(f"{self.path} line {number} is not a trial row (no 'trial_id'); fix or delete "
                                 "that line, then re-run")
            found[row["trial_id"]] = row
        if torn:
            warnings.warn(f"{self.path}: skipped {torn} torn line(s); those trials count as not finished",
                          stacklevel=2)
        return found

    def append(self, row: Mapping[str, Any]) -> None:
        line = json.dumps(row, sort_keys=True, default=float) + "\n"
        with open_appending(in_place_file(self.out, RESULTS), "a+b") as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell():
                handle.seek(-1, os.SEEK_END)
                if handle.read(1) != b"\n":   # a torn line left by a crash: start a fresh one
                    line = "\n" + line
            handle.write(line.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())

    def write_failures(self, failures: Sequence[Mapping[str, Any]]) -> None:
        write_text(self.out / FAILURES, "".join(json.dumps(f, sort_keys=True) + "\n" for f in failures))

    def frame(self):
        """The table as a pandas DataFrame, one row per trial, sorted by trial_id."""
        import pandas as pd

        return pd.DataFrame(sorted(self.rows().values(), key=lambda r: r["trial_id"]))
