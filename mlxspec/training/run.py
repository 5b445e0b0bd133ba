"""``mlxspec train-draft`` behind one entry point: ``train_draft(TrainOptions(...), progress)``.

The options record holds every flag of the command, named as the flag is (``head_vocab`` is
``--head-vocab``); ``resolved`` applies ``--quick`` and the defaults that depend on others, and
the model card's reproduction recipe is rendered from the resolved record (``recipe``), so a
flag is spelled in one place. Progress goes to one callback as ``Report``s: a bar's state, and
now and then a line worth keeping in a log.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from mlxspec.core.drafters.draft_model import DraftConfig, DraftModel
from mlxspec.errors import MlxspecError
from mlxspec.targets.eagle3 import LAYOUTS, save_eagle3, verifier_for
from mlxspec.targets.folders import save_head, tokenizer_fingerprint
from mlxspec.targets.loading import load
from mlxspec.targets.mlxlm import require_native
from mlxspec.torchpath import backend_spec
from mlxspec.training import eagle_train as et
from mlxspec.training import train as tr
from mlxspec.training.draft import init_from_target
from mlxspec.training import eagle3 as e3
from mlxspec.training.eagle import new_head

# --arch eagle: at 2,000 steps of the shipped recipe, 6e-4 kept more drafts held out than 3e-4,
# 1e-3 or 2e-3 (BENCHMARKS.md, "The eagle head"); the others were not swept
DEFAULT_LR = {"draft": 3e-4, "eagle": 6e-4, "eagle3": 3e-4}
ARCHS = ("draft", "eagle", "eagle3")


@dataclass(frozen=True)
class TrainOptions:
    """What ``train-draft`` was asked for; a field's name is its flag's (``_`` for ``-``)."""

    out: Path
    model: str = "default"
    arch: str = "draft"
    loss: str = "wtv"
    # --arch draft
    grpo: bool = False
    grpo_steps: int = 60
    grpo_group: int = 8
    grpo_reward: str = "auto"
    layers: int = 2
    hidden: int | None = None
    init: str = "target"
    prompts: int = 320
    max_new_tokens: int = 96
    data: Path | None = None
    # both
    head_vocab: int = 8192
    window: int = 5
    temp: float = 1.0
    min_p: float = 0.0  # --arch eagle, eagle3 with --loss wtv
    fit_top: int = 0  # --arch eagle, eagle3 with --loss eal or wtv
    steps: int = 400
    batch: int = 8
    lr: float | None = None  # None: DEFAULT_LR for the arch
    resume: bool = False
    checkpoint_every: int = 100
    seed: int = 0
    quick: bool = False
    # --arch eagle
    examples_per_category: int = 300
    max_examples: int | None = None
    target_written: int = 0
    feature_weight: float = 0.5
    context: int = 192
    backend: str = "mlx"
    device: str | None = None
    # --arch eagle3
    aux_layers: str | None = None  # comma-separated block indices; None: 2, L/2, L-3
    zero_layers: str | None = None  # of aux_layers, those the head is trained without (ablations)
    share_embeddings: bool = False  # write no embedding table: loaders take the target's
    format: str = "specforge"  # the published layout written (targets.eagle3.LAYOUTS)
    verifier: str | None = None  # --format speculators: the target's hub id or folder; None: targets.eagle3.verifier_for's

    def taps(self) -> tuple[tuple[int, ...] | None, tuple[int, ...]]:
        """(--aux-layers, --zero-layers) as block indices; None: the default taps."""
        def parse(flag: str, text: str | None) -> tuple[int, ...] | None:
            if text is None:
                return None
            try:
                return tuple(int(w) for w in text.split(","))
            except ValueError:
                raise MlxspecError(f"{flag} {text!r}: expected comma-separated block indices, e.g. 2,15,27") from None
        return parse("--aux-layers", self.aux_layers), parse("--zero-layers", self.zero_layers) or ()

    def checked(self) -> TrainOptions:
        """The options a run uses: the flags that do not apply refused, ``--quick``'s CI-sized
        settings in place of the ones they stand for, the learning rate's default filled in."""
        if self.arch not in ARCHS:
            raise MlxspecError(f"unknown --arch {self.arch!r}; choose {', '.join(ARCHS)}")
        o = replace(self, lr=self.lr or DEFAULT_LR[self.arch])
        if o.arch != "eagle3" and (o.aux_layers is not None or o.zero_layers is not None):
            raise MlxspecError("--aux-layers and --zero-layers choose the target layers an --arch eagle3 head reads")
        if o.arch != "eagle3" and o.share_embeddings:
            raise MlxspecError("--share-embeddings is for --arch eagle3: the other heads and drafts never store the "
                               "target's embedding table")
        if o.format not in LAYOUTS:
            raise MlxspecError(f"unknown --format {o.format!r}; choose one of: {', '.join(LAYOUTS)}")
        if (o.format != "specforge" or o.verifier is not None) and o.arch != "eagle3":
            raise MlxspecError("--format and --verifier choose how an --arch eagle3 head is written")
        if o.verifier is not None and o.format != "speculators":
            raise MlxspecError("--verifier names the target inside a --format speculators head")
        aux, zero = o.taps()
        if zero and not set(zero) <= set(aux or ()):
            raise MlxspecError(f"--zero-layers {o.zero_layers}: each must be one of --aux-layers (given explicitly)")
        if (o.min_p or o.fit_top) and o.arch == "draft":
            raise MlxspecError("--min-p and --fit-top shape an --arch eagle or eagle3 head's loss")
        if o.arch == "eagle3":  # no feature regression: its output is in its own space
            o = replace(o, feature_weight=0.0)
        if o.arch in ("eagle", "eagle3"):
            if o.quick:
                o = replace(o, examples_per_category=2, max_examples=22, head_vocab=1024, steps=30, batch=4,
                            context=64, checkpoint_every=15, window=3)
            return o
        if o.backend != "mlx" or o.device is not None:
            raise MlxspecError("--backend and --device choose where an eagle head is built and trained; "
                               "--arch draft trains and distils on MLX")
        if o.target_written:
            raise MlxspecError("--target-written is for --arch eagle; --arch draft always trains on the target's answers")
        if o.quick:
            o = replace(o, prompts=12, max_new_tokens=24, head_vocab=1024, layers=1, steps=40, batch=4,
                        checkpoint_every=20, grpo_steps=4, grpo_group=4)
        return o

    def draft_train_config(self) -> tr.TrainConfig:
        return tr.TrainConfig(loss=self.loss, k=self.window, temp=self.temp, steps=self.steps, batch=self.batch,
                              lr=self.lr, grpo_steps=self.grpo_steps if self.grpo else 0, grpo_group=self.grpo_group,
                              grpo_reward=self.grpo_reward, grpo_contexts=2 if self.quick else 4, seed=self.seed,
                              checkpoint_every=self.checkpoint_every)

    def eagle_train_config(self) -> et.EagleTrainConfig:
        return et.EagleTrainConfig(loss=self.loss, k=self.window, temp=self.temp, min_p=self.min_p,
                                   fit_top=self.fit_top, steps=self.steps, batch=self.batch,
                                   context=self.context, lr=self.lr, feature_weight=self.feature_weight,
                                   seed=self.seed, checkpoint_every=self.checkpoint_every)


# The model card's recipe per architecture: the fields it spells out, in order. A field is shown
# always, only when it differs from its default ("changed"), or only when another field is set.
ALWAYS, CHANGED = "always", "changed"
RECIPES: dict[str, tuple[tuple[str, str], ...]] = {
    "draft": (("arch", CHANGED), ("loss", ALWAYS), ("grpo", CHANGED), ("grpo_steps", "grpo"),
              ("grpo_group", "grpo"), ("layers", ALWAYS), ("head_vocab", ALWAYS), ("init", ALWAYS),
              ("window", ALWAYS), ("temp", ALWAYS), ("steps", ALWAYS), ("batch", ALWAYS), ("lr", ALWAYS),
              ("prompts", ALWAYS), ("max_new_tokens", ALWAYS), ("seed", ALWAYS), ("out", ALWAYS)),
    "eagle": (("arch", CHANGED), ("loss", ALWAYS), ("window", ALWAYS), ("temp", ALWAYS), ("min_p", CHANGED),
              ("fit_top", CHANGED), ("steps", ALWAYS), ("batch", ALWAYS), ("context", ALWAYS), ("lr", ALWAYS),
              ("feature_weight", ALWAYS), ("head_vocab", ALWAYS), ("examples_per_category", ALWAYS),
              ("max_examples", CHANGED), ("target_written", CHANGED), ("backend", CHANGED), ("seed", ALWAYS),
              ("out", ALWAYS)),
    "eagle3": (("arch", ALWAYS), ("loss", ALWAYS), ("window", ALWAYS), ("temp", ALWAYS), ("min_p", CHANGED),
               ("fit_top", CHANGED), ("steps", ALWAYS), ("batch", ALWAYS), ("context", ALWAYS), ("lr", ALWAYS),
               ("head_vocab", ALWAYS), ("examples_per_category", ALWAYS), ("max_examples", CHANGED),
               ("target_written", CHANGED), ("aux_layers", CHANGED), ("zero_layers", CHANGED),
               ("share_embeddings", CHANGED), ("backend", CHANGED), ("format", CHANGED), ("verifier", CHANGED),
               ("seed", ALWAYS), ("out", ALWAYS)),
}


def recipe(opts: TrainOptions) -> str:
    """The command line that reproduces a run, for the model card: ``opts`` resolved, so
    ``--quick``'s settings are spelled out."""
    defaults = {f.name: f.default for f in fields(TrainOptions)}
    words = ["mlxspec train-draft"]
    for name, shown in RECIPES[opts.arch]:
        value = getattr(opts, name)
        if (shown == CHANGED and value == defaults[name]) or (shown not in (ALWAYS, CHANGED) and not getattr(opts, shown)):
            continue
        flag = "--" + name.replace("_", "-")
        words.append(flag if value is True else f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}")
    return " ".join(words)


@dataclass(frozen=True)
class Report:
    """Where a run is: ``stage`` (what the bar says), ``done`` of ``total`` (None: unknown yet),
    and, every few steps, ``log``: a line for a log (a bar on a terminal says it already)."""

    stage: str
    done: int = 0
    total: int | None = None
    log: str | None = None


Progress = Callable[[Report], None]


@dataclass(frozen=True)
class TrainResult:
    """The run's summary (``--json``) and what to tell the user it did."""

    summary: dict[str, Any]
    message: str


def train_draft(opts: TrainOptions, progress: Progress | None = None) -> TrainResult:
    """Train a draft (``--arch draft``: self-distillation, then optionally GRPO) or an eagle head
    (``--arch eagle``: on the target's features over the offline corpus; ``--arch eagle3``: an
    EAGLE-3 head on the states of three of its blocks, written in the published format) into
    ``opts.out``, model card included. Bad options are refused before anything is loaded."""
    opts = opts.checked()
    report = progress or (lambda r: None)
    return _train_eagle(opts, report) if opts.arch in ("eagle", "eagle3") else _train_draft(opts, report)


def _check_out_folder(out: Path) -> None:
    """Refuse a ``--out`` folder that is a file now, before minutes of work, not after."""
    if out.exists() and not out.is_dir():
        raise MlxspecError(f"--out {out} is a file; give a folder")


def data_progress(report: Progress, every_s: float = 30.0) -> Callable[[str, int, int], None]:
    """A data stage's ``progress(stage, done, total)`` as Reports, with a log line at most every
    ``every_s`` seconds and at a stage's end: building features or the target's answers can take
    an hour, and a log would otherwise show nothing of it."""
    t0 = last = time.perf_counter()

    def progress(stage: str, done: int, total: int) -> None:
        nonlocal last
        now = time.perf_counter()
        log = None
        if done >= total or now - last >= every_s:
            log, last = f"{stage} {done}/{total} {now - t0:.0f}s", now
        report(Report(stage, done, total, log))

    return progress


def _every_10(step: int, total: int) -> bool:
    return step % 10 == 0 or step == total


def _train_draft(opts: TrainOptions, report: Progress) -> TrainResult:
    cfg = opts.draft_train_config()
    cfg.validate()
    _check_out_folder(opts.out)
    if opts.resume:
        tr.checkpoint_stage(opts.out)  # fails now, not after the data is built
    t0 = time.perf_counter()
    target = load(opts.model, "float32")
    require_native(target, "train-draft")
    dcfg = DraftConfig.for_target(target.config, tokenizer_fingerprint(target.tokenizer), num_layers=opts.layers,
                                  hidden_size=opts.hidden, head_vocab=opts.head_vocab, init=opts.init)
    report(Report("data"))
    data, data_path = tr.prepare_data(target, opts.data, opts.prompts, opts.max_new_tokens, opts.head_vocab, opts.seed,
                                      progress=data_progress(report))
    if len(data.vocab_ids) != dcfg.head_vocab:
        raise MlxspecError(f"{data_path} has a {len(data.vocab_ids)}-token head vocabulary, not {dcfg.head_vocab}")
    mx.random.seed(opts.seed)
    draft = DraftModel(dcfg, mx.array(data.vocab_ids), target.model.model.embed_tokens)
    if dcfg.init == "target":
        init_from_target(draft, target.model)
    loss = cfg.loss + ("+grpo" if opts.grpo else "")
    extra = {"target": target.name, "loss": loss, "data": str(data_path)}

    def on_step(h: tr.StepLog, total: int) -> None:
        line = (f"loss {h.loss:.4f} kl {h.kl:.3f} E[acc] greedy {h.eal:.2f} T {h.wtv:.2f} "
                f"{h.tokens_per_s:.0f} tok/s")
        report(Report(f"{h.stage} {loss} {line}", h.step, total,
                      f"{h.stage} step {h.step}/{total} {line} {time.perf_counter() - t0:.0f}s"
                      if _every_10(h.step, total) else None))

    report(Report(f"train {loss}", 0, cfg.steps + cfg.grpo_steps))
    history = tr.train(draft, data, cfg, opts.out, target=target, resume=opts.resume, progress=on_step, extra=extra)
    seconds = time.perf_counter() - t0
    peak = tr.peak_memory_gb()
    (opts.out / "README.md").write_text(tr.model_card(opts.out.name, recipe(opts), data, cfg, draft, history,
                                                      seconds, peak))
    summary = {"out": str(opts.out), "loss": loss, "seconds": seconds, "peak_memory_gb": peak,
               "data": data.meta, "draft": draft.cfg.__dict__, "train": cfg.__dict__,
               "trend": {a: tr.trend(history, a) for a in ("loss", "kl", "eal", "wtv")},
               "history": [h.__dict__ for h in history]}
    (k0, k1), (e0, e1), (w0, w1) = (summary["trend"][a] for a in ("kl", "eal", "wtv"))
    message = (f"wrote {opts.out}  ({seconds / 60:.1f} min, peak memory {peak:.1f} GB)\n"
               f"KL {k0:.3f} -> {k1:.3f}; expected accepted per {cfg.k}-window: greedy {e0:.2f} -> {e1:.2f}, "
               f"T={cfg.temp:g} {w0:.2f} -> {w1:.2f}")
    return TrainResult(summary, message)


def _save_eagle(opts: TrainOptions, target: Any, head: Any, data: Any, cfg: Any, history: list, seconds: float,
                taps: tuple[int, ...], zero: tuple[int, ...]) -> Any:
    """Write the trained head with its model card: an EAGLE-3 head (``taps``) in the published
    layout, with the target's embedding table unless it is shared; returns the head as saved."""
    command = recipe(opts)
    if not taps:
        save_head(head, opts.out, card=et.model_card(opts.out.name, command, data, cfg, head, history, seconds),
                  extra={"target": target.name, "recipe": command})
        return head
    head = e3.without_taps(head, zero, target)
    table = None if opts.share_embeddings else dict(tree_flatten(target.model.parameters()))["model.embed_tokens.weight"]
    verifier = verifier_for(opts.model, target, opts.verifier) if opts.format == "speculators" else None
    save_eagle3(head, opts.out, embed_table=table,
                extra={"mlxspec": {"target": target.name, "recipe": command,
                                   "tokenizer_sha256": tokenizer_fingerprint(target.tokenizer)}},
                layout=opts.format, verifier=verifier)
    (opts.out / "README.md").write_text(e3.model_card(opts.out.name, command, data, cfg, head, history, seconds,
                                                         target.config.num_layers, zero, table is not None))
    return head


def _train_eagle(opts: TrainOptions, report: Progress) -> TrainResult:
    """Features (built once, cached; on torch with ``--backend``), a fresh head, training, model
    card."""
    cfg = opts.eagle_train_config()
    cfg.validate()
    spec = backend_spec(opts.backend, opts.device)
    _check_out_folder(opts.out)
    t0 = time.perf_counter()
    teacher = load(opts.model, "float32", spec)
    target = teacher.source if spec != "mlx" else teacher  # the head is built and saved as MLX's
    require_native(target, f"train-draft --arch {opts.arch}")
    if opts.format == "speculators":
        verifier_for(opts.model, target, opts.verifier)  # a target with no verifier refused now, not after training
    # An EAGLE-3 head reads the states entering the blocks --aux-layers names (by default those
    # vLLM and SGLang tap when a config names none).
    aux, zero = opts.taps()
    taps = e3.config_for(target, 1, aux_layers=aux).aux_layers if opts.arch == "eagle3" else ()
    report(Report("features"))
    data = et.prepare_features(teacher, opts.examples_per_category, opts.max_examples, cfg.seed,
                               128 if opts.quick else 256, opts.target_written,
                               progress=data_progress(report), taps=taps)
    e3.zero_taps(data, taps, zero)
    vocab = et.head_vocabulary(data, opts.head_vocab, target)
    head = (e3.new_head(target, vocab, seed=cfg.seed, aux_layers=taps, zero_layers=zero) if taps
            else new_head(target, vocab, seed=cfg.seed))
    params = dict(tree_flatten(target.model.parameters()))  # the target's output rows: the teacher's
    rows = params.get("lm_head.weight", params["model.embed_tokens.weight"])[head.vocab_ids]

    def on_step(log: et.EagleStepLog) -> None:
        line = (f"eagle {cfg.loss} loss {log.loss:.3f} kl {log.kl:.2f} feat {log.feature:.3f} "
                f"acc1 {log.accept_1:.2f} chain {log.chain:.2f}")
        report(Report(line, log.step, cfg.steps,
                      f"step {log.step}/{cfg.steps} {line} {log.positions_per_s:.0f} positions/s "
                      f"{time.perf_counter() - t0:.0f}s" if _every_10(log.step, cfg.steps) else None))

    stepper = None
    if spec != "mlx":
        from mlxspec.training.torch_train import TorchStepper  # imports torch, an optional extra

        stepper = TorchStepper(head, cfg, teacher.model)
    report(Report(f"train eagle {cfg.loss}", 0, cfg.steps))
    history = et.train_head(head, data, rows, cfg, opts.out, resume=opts.resume, on_step=on_step, stepper=stepper)
    seconds = time.perf_counter() - t0
    head = _save_eagle(opts, target, head, data, cfg, history, seconds, taps, zero)
    peak = tr.peak_memory_gb()
    first, last = history[0], history[-1]
    message = (f"wrote {opts.out}  ({seconds / 60:.1f} min, peak memory {peak:.1f} GB)\n"
               f"first-draft acceptance {first.accept_1:.2f} -> {last.accept_1:.2f}; "
               f"{cfg.k}-chain expected accepted {first.chain:.2f} -> {last.chain:.2f}")
    summary = {"out": str(opts.out), "arch": opts.arch, "seconds": seconds, "peak_memory_gb": peak, "data": data.meta,
               "head": head.cfg.to_dict(), "train": cfg.__dict__, "history": [h.__dict__ for h in history]}
    return TrainResult(summary, message)
