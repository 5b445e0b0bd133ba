"""The torch target gives up threads while other processes hold cores (``torchpath.threads``)."""

import pytest

from mlxspec.torchpath import threads
from mlxspec.torchpath.threads import ThreadGovernor, threads_for


@pytest.mark.parametrize("others, cores, want", [
    (0.0, 2, 2), (0.05, 2, 2), (0.2, 2, 1), (0.5, 2, 1), (1.0, 2, 1),
    (0.0, 8, 8), (0.25, 8, 6), (0.5, 8, 4), (None, 4, 4), (0.0, 1, 1), (1.0, 1, 1),
])
def test_one_thread_per_core_that_others_leave_free(others, cores, want):
    assert threads_for(others, cores) == want


class FakeTorch:
    def __init__(self, n):
        self.n, self.calls = n, []

    def get_num_threads(self):
        return self.n

    def set_num_threads(self, n):
        self.n = n
        self.calls.append(n)


class FakeMeter:
    def __init__(self, shares):
        self.shares = iter(shares)

    def others_busy(self):
        return next(self.shares)

    def restart(self):
        pass


def _governor(monkeypatch, shares, cores=2):
    clock = [0.0]
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock[0])
    torch = FakeTorch(cores)
    gov = ThreadGovernor(torch, cores=cores, every_s=1.0)
    gov.meter = FakeMeter(shares)
    return gov, torch, clock


def test_the_governor_follows_the_load_once_a_second(monkeypatch):
    gov, torch, clock = _governor(monkeypatch, [0.5, 0.5, 0.0])
    gov.tick()  # too soon: nothing looked at
    assert torch.calls == []
    # the first look comes early (it covers the model's loading), then one a second
    for t, want in ((0.1, 1), (0.6, 1), (1.1, 1), (2.1, 2)):
        clock[0] = t
        gov.tick()
        assert torch.n == want
    assert torch.calls == [1, 2] and gov.changes == 2


def test_the_governor_stands_down_when_someone_else_sets_threads(monkeypatch):
    gov, torch, clock = _governor(monkeypatch, [0.5, 0.5])
    torch.n = 2
    torch.set_num_threads(1)  # e.g. bench --torch-threads 1
    torch.calls.clear()
    clock[0] = 1.0
    gov.tick()
    torch.set_num_threads(2)
    clock[0] = 5.0
    gov.tick()
    assert not gov.active and torch.calls == [2]


def test_the_torch_target_on_the_cpu_has_a_governor():
    pytest.importorskip("torch")
    from pathlib import Path

    from tiny import tiny_target

    from mlxspec.targets.loading import LoadedModel
    from mlxspec.torchpath.load import to_torch

    t = tiny_target()
    lm = to_torch(LoadedModel(t.model, t.tokenizer, "tiny", Path("tiny"), "float32", 64), "float32", "cpu")
    assert isinstance(lm.model.threads, ThreadGovernor)
    lm.model.threads.next_look = 0.0  # look now
    import torch

    lm.model(torch.tensor([[1, 2, 3]]), lm.model.make_cache())
    assert lm.model.threads.threads == torch.get_num_threads()
