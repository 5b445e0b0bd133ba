"""The compiled target pass (``torchpath.compiled``): every row of a verify pass, chain or tree,
has the bits of the compiled one-token pass at its position, across key blocks and at both
thread counts; greedy speculation then emits target-only's tokens; its logits are the eager
pass's to float rounding; the taps an EAGLE-3 head reads are the eager ones'; and a file is
found only by a model of the shapes it was compiled for."""

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings, strategies as st  # noqa: E402

from mlxspec.torchpath import compiled  # noqa: E402
from mlxspec.torchpath.invariant import make_batch_invariant  # noqa: E402
from tests.tiny import (greedy_alone_and_self_drafted, quantized_twin, torch_rows_equal_one_token_passes,  # noqa: E402
                        torch_twin)


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    """A tiny int4 twin (3 blocks) with its graphs compiled (about 30 s here) and loaded."""
    _, model = quantized_twin(seed=3, num_layers=3)
    make_batch_invariant(model)
    folder = tmp_path_factory.mktemp("compiled")
    compiled.compile_to(model, folder)
    model.compiled = compiled.load_from(model, folder)
    assert model.compiled is not None
    model.folder = folder
    return model


@settings(max_examples=10, deadline=None)
@given(context=st.integers(1, 600), tokens=st.lists(st.integers(0, 47), min_size=2, max_size=9))
def test_every_row_has_the_one_token_bits(twin, context, tokens):
    ctx = [(7 * i + 3) % 48 for i in range(context)]
    got = torch_rows_equal_one_token_passes(twin, ctx, tokens)
    assert all(all(r) for r in got), got


def test_rows_keep_their_bits_past_sixteen_key_blocks(twin):
    """At 1,086 cached tokens a pass of 5 crosses into the 18th block of ``ATTEND_BLOCK`` keys:
    the sums over blocks stay in order however many there are."""
    ctx = [(11 * i + 5) % 48 for i in range(1086)]
    got = torch_rows_equal_one_token_passes(twin, ctx, [3, 14, 15, 9, 26])
    assert all(all(r) for r in got), got


@pytest.mark.parametrize("threads", [1, 2])
def test_both_thread_counts_give_the_same_bits(twin, threads):
    """The thread governor changes the count between passes: rows stay invariant, and the bits
    are those of the other count."""
    before = torch.get_num_threads()
    ctx = [(3 * i + 1) % 48 for i in range(254)]
    with torch.inference_mode():
        reference = twin(torch.tensor([ctx + [5, 6, 7]]), twin.make_cache())
        torch.set_num_threads(threads)
        try:
            got = torch_rows_equal_one_token_passes(twin, ctx, [5, 6, 7, 8])
            again = twin(torch.tensor([ctx + [5, 6, 7]]), twin.make_cache())
        finally:
            torch.set_num_threads(before)
    assert all(all(r) for r in got), got
    assert torch.equal(reference, again)


def test_a_tree_pass_has_the_one_token_bits(twin):
    """Two branches after 20 cached tokens: each node's row is the one-token pass along its path."""
    rows = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    mask = torch.cat([torch.ones((4, 20), dtype=torch.bool), rows], dim=1)
    prompt, nodes = list(range(20)), [5, 6, 7, 8]
    with torch.inference_mode():
        cache = twin.make_cache()
        twin(torch.tensor([prompt]), cache)
        tree = twin(torch.tensor([nodes]), cache, mask=mask, positions=torch.tensor([20, 21, 21, 22]))[0]
        for path, node in (([0], 0), ([0, 1], 1), ([0, 2], 2), ([0, 2, 3], 3)):
            c = twin.make_cache()
            twin(torch.tensor([prompt]), c)
            for i in path:
                last = twin(torch.tensor([[nodes[i]]]), c)[0, 0]
            assert torch.equal(tree[node], last), path


def test_greedy_speculation_emits_the_target_only_tokens(twin):
    alone, drafted = greedy_alone_and_self_drafted(twin, (1, 3, 7))
    assert len(alone) == 24 and all(out == alone for out in drafted)


def test_the_compiled_pass_is_the_eager_one_to_float_rounding_and_taps_the_same_states(twin):
    prompt = [(5 * i + 1) % 48 for i in range(300)]
    out = {}
    for use in (False, True):
        kept, twin.compiled = twin.compiled, twin.compiled if use else None
        with torch.inference_mode():
            out[use] = twin(torch.tensor([prompt]), twin.make_cache(), return_hidden=(0, 1, 3))
        twin.compiled = kept
    (eager, eager_taps), (fast, fast_taps) = out[False], out[True]
    # The two attentions sum in different orders: a last-bit difference that, once in a while,
    # tips an activation's bfloat16 rounding in the products (one position of 300 here moved
    # ~1e-2); a wrong mask, scale or state would move them all by O(1).
    for a, b in ((eager, fast), (eager_taps, fast_taps)):
        assert ((a - b).pow(2).mean() / a.pow(2).mean()).sqrt() < 1e-3
        assert (a - b).abs().max() < 5e-2
    assert torch.equal(eager_taps[..., :64], fast_taps[..., :64])  # the embedding, untouched by either


def test_only_a_model_of_the_compiled_shapes_finds_the_graphs(twin):
    _, same = quantized_twin(seed=4, num_layers=3)
    make_batch_invariant(same)
    assert compiled.load_from(same, twin.folder) is not None  # the weights are inputs: other weights, same graphs
    _, other = quantized_twin(seed=3, num_layers=2)
    make_batch_invariant(other)
    assert compiled.supported(other) and compiled.load_from(other, twin.folder) is None
    float_twin = torch_twin()
    make_batch_invariant(float_twin)
    assert not compiled.supported(float_twin)
    with pytest.raises(ValueError, match="int4"):
        compiled.compile_to(float_twin, twin.folder)


def test_a_decode_runs_both_graphs(twin, monkeypatch):
    """The checks above are of the compiled graphs: one-token passes take one, verify passes the other."""
    calls = []
    for name, fn in list(twin.compiled.graphs.items()):
        monkeypatch.setitem(twin.compiled.graphs, name, lambda *a, fn=fn, name=name: calls.append(name) or fn(*a))
    torch_rows_equal_one_token_passes(twin, [1, 2, 3], [4, 5])
    assert set(calls) == {"one", "many"}


def test_graphs_of_earlier_builds_are_pruned_and_nothing_else(twin, tmp_path):
    """A compile marks its graphs with the build that made them; graphs another build made (or
    an unmarked older one) go, this build's graphs for other shapes and foreign folders stay."""
    made = twin.folder / compiled.key(twin)
    assert (made / compiled.BUILD_FILE).read_text() == compiled.build()
    folder = tmp_path / "compiled"
    for name, files in {"old": {"one.bin": "x", "many.bin": "x"}, "other": {"one.bin": "x", "build": "0" * 16},
                        "mine": {"one.bin": "x", "build": compiled.build()}, "foreign": {"one.bin": "x", "notes.txt": ""},
                        "inductor": {"one.bin": "x"}}.items():
        (folder / name).mkdir(parents=True)
        for f, text in files.items():
            (folder / name / f).write_text(text)
    assert {p.name for p in compiled.prune_stale(folder)} == {"old", "other"}
    assert sorted(p.name for p in folder.iterdir()) == ["foreign", "inductor", "mine"]


def test_a_damaged_file_leaves_the_eager_pass_with_a_note(twin, tmp_path, monkeypatch, capsys):
    """A load that finds the graphs unreadable says so in one line and runs eager."""
    import shutil
    from types import SimpleNamespace

    from mlxspec.targets import loading

    shutil.copytree(twin.folder, tmp_path / "compiled")
    _, model = quantized_twin(seed=3, num_layers=3)
    make_batch_invariant(model)
    (tmp_path / "compiled" / compiled.key(model) / "one.bin").write_bytes(b"not a graph")
    monkeypatch.setattr(loading, "compiled_folder", lambda: tmp_path / "compiled")
    loaded = loading.with_compiled(SimpleNamespace(dtype="quantized", model=model))
    assert loaded.model.compiled is None
    note = capsys.readouterr().err
    assert "did not load" in note and "running eager" in note and len(note.strip().splitlines()) == 1


def test_a_failed_compile_is_a_note_not_an_error(monkeypatch):
    """`models pull` on a machine that cannot compile (no C++ compiler, say): one line, no failure."""
    from types import SimpleNamespace

    from mlxspec.targets import loading

    _, model = quantized_twin(seed=3, num_layers=3)
    make_batch_invariant(model)
    model.compiled = None

    def cannot(*_args, **_kwargs):
        raise RuntimeError("no working C++ compiler found")

    monkeypatch.setattr(loading, "torch_may_run", lambda *_: True)
    monkeypatch.setattr(loading, "load", lambda *_a, **_k: SimpleNamespace(
        name="tiny", backend="torch:cpu", dtype="quantized", model=model))
    monkeypatch.setattr(compiled, "compile_to", cannot)
    lines = []
    loading.compile_target("tiny", lines.append)
    assert len(lines) == 1 and "could not compile tiny's pass" in lines[0] and "C++ compiler" in lines[0]


@pytest.mark.model
def test_the_default_models_compiled_pass_keeps_every_row_bitwise(lm):
    """The default as `make setup` leaves it: its loads on torch take the compiled pass, whose
    verify rows are its one-token passes."""
    from mlxspec.targets import loading

    model = loading.load("default", "quantized", backend="torch:cpu").model
    if model.compiled is None:
        pytest.skip("no compiled pass in the store (`mlxspec models pull` compiles it; it needs a C++ compiler)")
    ctx = lm.tokenizer.encode("Explain in two sentences why the moon has phases. " * 12)[:250]
    tokens = lm.tokenizer.encode(" The moon orbits the Earth every month")[:8]
    got = torch_rows_equal_one_token_passes(model, ctx, tokens)
    assert all(all(r) for r in got), got
