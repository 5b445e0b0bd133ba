"""How busy other processes keep this machine's CPUs, from Linux's ``/proc/stat`` less this
process's own CPU time. Measurements taken while others hold cores are not this machine's
quiet speed (``targets.costcurve`` does not cache them), and torch's CPU threads wait on each
other when one of them shares a core (``torchpath.threads`` gives such cores up)."""

from __future__ import annotations

import os
import resource
import time


def busy_cpu_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (None where ``/proc/stat`` is missing)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + ticks[4]  # idle, iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


class CpuMeter:
    """From its creation (or the last ``restart``) on: the share of all CPUs that other
    processes kept busy (None where the machine does not say)."""

    def __init__(self):
        self.restart()

    def restart(self) -> None:
        self.t0, self.busy0, self.own0 = time.perf_counter(), busy_cpu_seconds(), own_cpu_seconds()

    def seconds(self) -> float:
        return time.perf_counter() - self.t0

    def others_busy(self) -> float | None:
        busy, wall = busy_cpu_seconds(), self.seconds()
        if busy is None or self.busy0 is None or wall <= 0:
            return None
        others = (busy - self.busy0) - (own_cpu_seconds() - self.own0)
        return min(1.0, max(0.0, others / (wall * (os.cpu_count() or 1))))
