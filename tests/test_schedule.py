"""``core/schedule.py``: the warm-up and the rotating order every measurement times in. The
orders are pinned literally: results measured before and after a change must stay comparable."""

from mlxspec.core.schedule import alternated, rotated, timed_rounds, warmup_rounds


def test_rotated_starts_at_the_shift_and_wraps():
    assert rotated(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert rotated(["a", "b", "c"], 1) == ["b", "c", "a"]
    assert rotated(["a", "b", "c"], 5) == ["c", "a", "b"]
    assert rotated([], 3) == []


def test_alternated_reverses_every_other_round():
    assert alternated((1, 2, 3), 0) == [1, 2, 3]
    assert alternated((1, 2, 3), 1) == [3, 2, 1]
    assert alternated((1, 2, 3), 2) == [1, 2, 3]


def test_warmup_passes_over_the_methods_in_order():
    assert warmup_rounds(["a", "b"], 2) == [["a", "b"], ["a", "b"]]
    assert warmup_rounds([1, 3, 5], 1, each=2) == [[1, 1, 3, 3, 5, 5]]
    assert warmup_rounds(["a"], 0) == []


def test_timed_rounds_turn_the_order_round_by_round():
    assert timed_rounds(["t", "s", "m"], ["p0", "p1", "p2", "p3"]) == [
        ("p0", ["t", "s", "m"]), ("p1", ["s", "m", "t"]), ("p2", ["m", "t", "s"]), ("p3", ["t", "s", "m"])]
    assert timed_rounds(["t", "s", "m"], ["p0", "p1"], start=2) == [("p0", ["m", "t", "s"]), ("p1", ["t", "s", "m"])]
    assert timed_rounds(["a", "b", "c"], range(3), turn=alternated) == [
        (0, ["a", "b", "c"]), (1, ["c", "b", "a"]), (2, ["a", "b", "c"])]


def test_every_method_runs_in_every_position_equally_often():
    methods = [0, 1, 2, None]
    rounds = [order for _, order in timed_rounds(methods, range(8))]
    for position in range(len(methods)):
        column = [r[position] for r in rounds]
        assert all(column.count(m) == 2 for m in methods)
