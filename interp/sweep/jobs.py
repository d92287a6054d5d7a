"""What every executor shares: a Job, its Outcome, the Executor interface and `execute`, the
function a worker runs for one trial (interp.sweep.executors: the local process pool and the
factory; interp.sweep.ray_executor: Ray)."""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Job:
    key: str            # the trial id
    params: dict
    run_dir: str


@dataclass
class Outcome:
    job: Job
    row: dict | None    # the trial's row, None when it failed
    error: str | None   # the traceback or the reason, None when it succeeded
    attempts: int = 1   # times the job was started (local); Ray retries inside and reports 1


def one_thread() -> None:
    """Worker start: torch (and OpenMP / MKL) with one thread, whether or not torch is loaded yet."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def worker_start(parent: int) -> None:
    """Pool initializer: one thread, and exit when the driver is gone (killed with SIGKILL, say)
    rather than wait for work forever as an orphan."""
    one_thread()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def execute(fn: Callable[[dict, str], dict], params: dict, run_dir: str) -> tuple[str, Any]:
    """Run one trial in a worker: ("ok", row) or ("error", traceback text). One torch thread."""
    one_thread()
    try:
        row = fn(params, run_dir)
        if not isinstance(row, dict):
            raise TypeError(f"the trial function must return a dict; got {type(row).__name__}")
        return "ok", row
    except Exception:  # noqa: BLE001 - reported as the trial's failure, the sweep goes on
        return "error", traceback.format_exc()


class Executor(Protocol):
    def run(self, fn: Callable, jobs: Sequence[Job], on_done: Callable[[Outcome], None]) -> None: ...

    def close(self) -> None: ...
