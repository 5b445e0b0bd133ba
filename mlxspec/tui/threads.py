"""Leaving a process whose worker thread ran MLX, without aborting it."""

from __future__ import annotations

import time
from pathlib import Path


def wait_for_thread_exit(native_id: int | None, timeout: float = 2.0) -> None:
    """Wait until the OS thread ``native_id`` is gone.

    A worker thread can have ended as far as Python knows while its OS thread still runs MLX's
    thread-local destructors, which take the GIL; if the interpreter is already finalising by
    then, the process aborts ("terminate called without an active exception", exit status 134;
    MLX 0.32 on CPython 3.11, about one exit in three after a chat turn). Linux shows the
    thread in /proc; elsewhere, wait briefly."""
    if native_id is None:
        return
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        time.sleep(0.2)
        return
    deadline = time.monotonic() + timeout
    while (tasks / str(native_id)).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
