import dataclasses

import numpy as np
import pytest
from mlx.utils import tree_flatten
from tiny import tiny_data, tiny_draft, tiny_target

from mlxspec.errors import MlxspecError
from mlxspec.targets.folders import load_draft
from mlxspec.training.train import TrainConfig, batch_order, train, trend


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def data(target):
    return tiny_data(target, sequences=12, prompt=5, gen=10)


def weights(model) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in tree_flatten(model.parameters())}


def test_the_options_record_has_one_field_per_flag_and_spells_the_recipe():
    """``train-draft`` passes its flags to ``TrainOptions`` by name; the model card's recipe is
    rendered from the record: the shipped models' recipes come back from their options."""
    import inspect
    from pathlib import Path

    from mlxspec.cli import train_draft
    from mlxspec.training.run import TrainOptions, recipe

    flags = set(inspect.signature(train_draft).parameters) - {"as_json"}
    assert flags == {f.name for f in dataclasses.fields(TrainOptions)}
    models = Path("mlxspec/models")
    draft = TrainOptions(out=models / "smollm2-135m-draft", loss="eal", steps=450).checked()
    assert recipe(draft) == (
        "mlxspec train-draft --loss eal --layers 2 --head-vocab 8192 --init target --window 5 --temp 1 --steps 450 "
        "--batch 8 --lr 0.0003 --prompts 320 --max-new-tokens 96 --seed 0 --out mlxspec/models/smollm2-135m-draft")
    eagle = TrainOptions(out=models / "smollm2-135m-eagle", arch="eagle", loss="eal", window=3, steps=2000,
                         context=160, target_written=3300, backend="torch", lr=3e-4).checked()
    assert recipe(eagle) == (
        "mlxspec train-draft --arch eagle --loss eal --window 3 --temp 1 --steps 2000 --batch 8 --context 160 "
        "--lr 0.0003 --feature-weight 0.5 --head-vocab 8192 --examples-per-category 300 --target-written 3300 "
        "--backend torch --seed 0 --out mlxspec/models/smollm2-135m-eagle")
    eagle3 = TrainOptions(out=Path("h"), arch="eagle3", loss="eal", window=3, steps=2000, context=160,
                          aux_layers="2,15,27,30", zero_layers="30", backend="torch").checked()
    assert recipe(eagle3) == (
        "mlxspec train-draft --arch eagle3 --loss eal --window 3 --temp 1 --steps 2000 --batch 8 --context 160 "
        "--lr 0.0003 --head-vocab 8192 --examples-per-category 300 --aux-layers 2,15,27,30 --zero-layers 30 "
        "--backend torch --seed 0 --out h")
    chat = TrainOptions(out=Path("c"), arch="eagle", window=3, min_p=0.1, fit_top=3, backend="torch").checked()
    assert "--temp 1 --min-p 0.1 --fit-top 3 --steps 400" in recipe(chat)
    assert "--lr 0.0006" in recipe(chat)  # each arch's own default, spelled in the recipe  # spelled only where they shape the loss
    with pytest.raises(MlxspecError, match="--min-p"):
        TrainOptions(out=Path("c"), min_p=0.1).checked()  # --arch draft's loss is not shaped so
    with pytest.raises(MlxspecError, match="--fit-top"):
        TrainOptions(out=Path("c"), fit_top=3).checked()
    quick = TrainOptions(out=Path("d"), quick=True, grpo=True).checked()  # --quick spelled out
    assert recipe(quick) == (
        "mlxspec train-draft --loss wtv --grpo --grpo-steps 4 --grpo-group 4 --layers 1 --head-vocab 1024 --init target "
        "--window 5 --temp 1 --steps 40 --batch 4 --lr 0.0003 --prompts 12 --max-new-tokens 24 --seed 0 --out d")
    quick = TrainOptions(out=Path("e"), arch="eagle", quick=True).checked()
    assert recipe(quick) == (
        "mlxspec train-draft --arch eagle --loss wtv --window 3 --temp 1 --steps 30 --batch 4 --context 64 --lr 0.0006 "
        "--feature-weight 0.5 --head-vocab 1024 --examples-per-category 2 --max-examples 22 --seed 0 --out e")


def test_bad_settings_are_refused():
    for bad in (dict(k=0), dict(loss="ce"), dict(temp=0.0), dict(steps=0), dict(grpo_steps=2, grpo_group=1),
                dict(grpo_reward="best")):
        with pytest.raises(MlxspecError):
            TrainConfig(**bad).validate()


@pytest.mark.parametrize("loss,watch,better", [("kl", "kl", "lower"), ("eal", "eal", "higher"),
                                                ("wtv", "wtv", "higher")])
def test_each_loss_improves_its_own_objective(tmp_path, target, data, loss, watch, better):
    draft = tiny_draft(target, layers=1, init="random")
    cfg = TrainConfig(loss=loss, steps=60, batch=4, lr=3e-3, warmup=5, kl_anneal=0.3, k=3)
    history = train(draft, data, cfg, tmp_path / loss)
    first, last = trend(history, watch)
    assert (last < first) if better == "lower" else (last > first), (first, last)
    assert (tmp_path / loss / "draft.safetensors").is_file()


def test_training_is_deterministic_and_resume_continues_the_same_run(tmp_path, target, data):
    cfg = TrainConfig(loss="wtv", steps=12, batch=4, lr=1e-3, warmup=2, checkpoint_every=6, k=3, seed=7)
    a = tiny_draft(target, init="random")
    full = train(a, data, cfg, tmp_path / "a")
    b = tiny_draft(target, init="random")
    train(b, data, cfg, tmp_path / "b")
    assert weights(a).keys() == weights(b).keys()
    for k, v in weights(a).items():
        np.testing.assert_array_equal(v, weights(b)[k])

    # Interrupted during step 7, after the checkpoint at step 6, then resumed.
    class Interrupt(Exception):
        pass

    def stop_at_7(h, total):
        if h.step == 7:
            raise Interrupt

    c = tiny_draft(target, init="random")
    with pytest.raises(Interrupt):
        train(c, data, cfg, tmp_path / "c", progress=stop_at_7)
    d = tiny_draft(target, init="random", seed=99)  # the checkpoint, not the init, must decide
    resumed = train(d, data, cfg, tmp_path / "c", resume=True)
    assert [h.step for h in resumed] == list(range(1, 13))
    for k, v in weights(a).items():
        np.testing.assert_allclose(v, weights(d)[k], rtol=1e-5, atol=1e-6)
    assert [round(h.loss, 4) for h in resumed] == [round(h.loss, 4) for h in full]


def test_resume_refuses_another_architecture_or_recipe(tmp_path, target, data):
    cfg = TrainConfig(loss="kl", steps=2, batch=4, checkpoint_every=1)
    train(tiny_draft(target, layers=1), data, cfg, tmp_path / "x")
    with pytest.raises(MlxspecError, match="another architecture"):
        train(tiny_draft(target, layers=2), data, cfg, tmp_path / "x", resume=True)
    with pytest.raises(MlxspecError, match="other settings"):
        train(tiny_draft(target, layers=1), data, dataclasses.replace(cfg, lr=1.0), tmp_path / "x", resume=True)
    with pytest.raises(MlxspecError, match="no readable checkpoint"):
        train(tiny_draft(target), data, cfg, tmp_path / "empty", resume=True)


def test_nan_loss_stops_naming_the_step(tmp_path, target, data):
    poisoned = dataclasses.replace(data, teacher_logp=np.full_like(data.teacher_logp, np.nan))
    with pytest.raises(MlxspecError, match="distill step 1"):
        train(tiny_draft(target), poisoned, TrainConfig(loss="kl", steps=3, batch=4), tmp_path / "n")


def test_tiny_dataset_is_refused(tmp_path, target):
    small = tiny_data(target, sequences=2, prompt=4, gen=5)
    with pytest.raises(MlxspecError, match="at least 64"):
        train(tiny_draft(target), small, TrainConfig(steps=2), tmp_path / "s")


def test_batch_order_is_epochs_of_permutations():
    order = batch_order(10, steps=5, batch=4, seed=1)
    assert order.shape == (5, 4)
    assert sorted(order.ravel()[:10].tolist()) == list(range(10))
    np.testing.assert_array_equal(order, batch_order(10, 5, 4, 1))


@pytest.mark.parametrize("reward", ["greedy", "sampling"])
def test_grpo_stage_runs_scores_with_the_target_and_saves(tmp_path, target, data, reward):
    cfg = TrainConfig(loss="wtv", steps=4, batch=4, k=3, grpo_steps=3, grpo_group=4, grpo_contexts=2,
                      grpo_reward=reward, lr=1e-3)
    draft = tiny_draft(target)
    history = train(draft, data, cfg, tmp_path / "g", target=target)
    grpo = [h for h in history if h.stage == "grpo"]
    assert len(grpo) == 3 and all(0.0 <= h.reward <= cfg.k for h in grpo)
    assert all(np.isfinite(h.loss) for h in grpo)
    loaded = load_draft(tmp_path / "g", target)
    np.testing.assert_allclose(np.array(loaded.lm_head.weight), np.array(draft.lm_head.weight), atol=2e-3)
    with pytest.raises(MlxspecError, match="needs the target"):
        train(tiny_draft(target), data, cfg, tmp_path / "h")


def test_a_finished_distillation_can_be_extended_with_grpo(tmp_path, target, data):
    cfg = TrainConfig(loss="eal", steps=4, batch=4, k=3, checkpoint_every=2)
    draft = tiny_draft(target)
    train(draft, data, cfg, tmp_path / "e")
    more = dataclasses.replace(cfg, grpo_steps=2, grpo_group=4, grpo_contexts=1)
    history = train(tiny_draft(target, seed=5), data, more, tmp_path / "e", target=target, resume=True)
    assert [h.stage for h in history] == ["distill"] * 4 + ["grpo"] * 2


@pytest.mark.model
def test_quick_cli_run_on_the_real_target_improves_its_objective_and_writes_a_card(quick_draft):
    out, summary = quick_draft
    assert summary["loss"] == "wtv+grpo"
    (kl0, kl1), (w0, w1) = summary["trend"]["kl"], summary["trend"]["wtv"]
    assert kl1 < kl0 and w1 > w0
    assert [h["stage"] for h in summary["history"]].count("grpo") == 4
    card = (out / "README.md").read_text()
    assert "mlxspec train-draft --loss wtv --grpo --grpo-steps 4" in card and "peak memory" in card
    assert summary["peak_memory_gb"] < 8


@pytest.mark.model
@pytest.mark.parametrize("loss,watch", [("kl", "kl"), ("eal", "eal")])
def test_quick_cli_run_for_each_loss_decreases_it(tmp_path, quick_draft, loss, watch):
    import json

    from typer.testing import CliRunner

    from mlxspec.cli import app

    r = CliRunner().invoke(app, ["train-draft", "--quick", "--loss", loss, "--out", str(tmp_path / loss), "--json"])
    assert r.exit_code == 0, r.output
    first, last = json.loads(r.stdout)["trend"][watch]
    assert (last < first) if watch == "kl" else (last > first), (first, last)


@pytest.mark.model
def test_cli_refuses_bad_training_input(tmp_path):
    from typer.testing import CliRunner

    from mlxspec.cli import app

    for args, msg in ((["--window", "0"], "window K must be >= 1"), (["--loss", "ce"], "unknown loss"),
                      (["--layers", "7"], "layers must be in 1..4"), (["--resume"], "no readable checkpoint"),
                      (["--prompts", "1", "--max-new-tokens", "2", "--head-vocab", "512"], "at least 64 positions")):
        r = CliRunner().invoke(app, ["train-draft", "--out", str(tmp_path / "o"), *args])
        assert r.exit_code == 2 and msg in r.output, r.output


def test_data_stages_log_a_line_now_and_then_and_at_their_end():
    from mlxspec.training.run import data_progress

    reports = []
    quiet = data_progress(reports.append, every_s=3600)
    for i in (64, 128, 192):
        quiet("features", i, 192)
    assert [r.log for r in reports] == [None, None, reports[-1].log] and reports[-1].log.startswith("features 192/192 ")
    assert [(r.stage, r.done, r.total) for r in reports] == [("features", i, 192) for i in (64, 128, 192)]
    reports.clear()
    chatty = data_progress(reports.append, every_s=0)
    chatty("target answers", 128, 3300)
    assert reports[0].log.startswith("target answers 128/3300 ")
