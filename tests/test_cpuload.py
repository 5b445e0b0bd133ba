import pytest

from mlxspec import cpuload


def _fake_machine(monkeypatch, busy, own, clock, cpus=2):
    monkeypatch.setattr(cpuload, "busy_cpu_seconds", lambda: next(busy))
    monkeypatch.setattr(cpuload, "own_cpu_seconds", lambda: next(own))
    monkeypatch.setattr(cpuload.os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(cpuload.time, "perf_counter", lambda: next(clock))


def test_the_cpu_meter_sees_other_processes_not_its_own(monkeypatch):
    _fake_machine(monkeypatch, iter([100.0, 103.0]), iter([10.0, 11.0]), iter([0.0, 2.0]))
    meter = cpuload.CpuMeter()
    assert meter.others_busy() == pytest.approx((3.0 - 1.0) / (2.0 * 2))  # 2 of 4 CPU-seconds were others'


def test_the_cpu_meter_says_nothing_where_the_machine_does_not(monkeypatch):
    _fake_machine(monkeypatch, iter([None, None]), iter([0.0, 1.0]), iter([0.0, 1.0]))
    assert cpuload.CpuMeter().others_busy() is None


def test_on_linux_the_meter_reads_the_real_machine():
    if cpuload.busy_cpu_seconds() is None:
        pytest.skip("no /proc/stat here")
    meter = cpuload.CpuMeter()
    sum(i * i for i in range(200_000))  # our own work is not counted as others'
    share = meter.others_busy()
    assert share is not None and 0.0 <= share <= 1.0
