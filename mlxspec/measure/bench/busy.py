"""Measuring under load: other processes that each keep one core busy while a benchmark runs
(``bench --busy N``), so "how fast with a core taken" is one command, not a hand-made setup."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

SPIN = "while True: pass"


@contextmanager
def busy_cores(n: int) -> Iterator[None]:
    """``n`` spinning Python processes for the duration of the block, killed after it."""
    procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(max(0, n))]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
