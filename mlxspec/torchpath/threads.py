"""torch's CPU threads, given up while other processes hold cores.

torch splits every matmul across its OpenMP threads and waits for all of them at the end. When
another process holds one of the cores, the thread that shares it is scheduled only part of the
time and every operation waits for it: measured here, SmolLM2-135M at torch's default 2 threads
fell from ~31 to 0.7-1.6 tok/s while other work ran, where 1 thread kept 8-20 tok/s (BENCHMARKS,
"under load"). So the torch target checks, about once a second between passes, how much of the
machine other processes used meanwhile, and runs on the cores they leave free.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from mlxspec.cpuload import CpuMeter

EVERY_S = 1.0  # how often the load is looked at: /proc/stat costs ~30 us, a pass tens of ms
FIRST_S = 0.1  # the first look, over the model's loading: a prefill is one long pass
TAKEN = 0.25  # a core counts as taken once other processes keep it this busy


def threads_for(others_busy: float | None, cores: int) -> int:
    """Threads for a machine of ``cores`` cores whose other processes kept ``others_busy`` of
    all of them busy: one per core they leave free, at least one (all of them when unknown)."""
    if others_busy is None:
        return cores
    taken = max(0, math.ceil(others_busy * cores - TAKEN))
    return max(1, cores - taken)


class ThreadGovernor:
    """Sets ``torch.set_num_threads`` from the load every ``every_s`` seconds, when ``tick`` is
    called (by the torch target before each pass). Stands down for good once anyone else sets
    the thread count (``--torch-threads`` of ``bench``, a user's own code), so an explicit
    choice is never overridden."""

    def __init__(self, torch: Any, cores: int | None = None, every_s: float = EVERY_S, first_s: float = FIRST_S):
        self.torch, self.every_s = torch, every_s
        self.cores = cores or torch.get_num_threads() or os.cpu_count() or 1
        self.meter, self.next_look = CpuMeter(), time.monotonic() + min(first_s, every_s)
        self.threads = torch.get_num_threads()
        self.active = True
        self.changes = 0

    def tick(self) -> None:
        if not self.active or time.monotonic() < self.next_look:
            return
        if self.torch.get_num_threads() != self.threads:
            self.active = False
            return
        want = threads_for(self.meter.others_busy(), self.cores)
        if want != self.threads:
            self.torch.set_num_threads(want)
            self.threads, self.changes = want, self.changes + 1
        self.meter.restart()
        self.next_look = time.monotonic() + self.every_s
