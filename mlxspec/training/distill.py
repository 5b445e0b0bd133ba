"""Self-distillation data for draft training: prompts, the target's own continuations, and the
target's next-token distributions along them as the teacher.

The teacher is computed once and cached, so every loss of the study trains on identical data:
for each generated position, the target's log-probabilities at T=1 over the draft's head
vocabulary (float16), and the target's full-vocabulary argmax. The mass outside the head
vocabulary is not stored; it is where the draft has q = 0, so the acceptance terms
(sum_v min(p, q), argmax matches) stay exact and only KL needs the restricted, renormalised p.

Benchmark prompts are never trained on: every Spec-Bench question (which includes 80 GSM8K
items and the 80 MT-Bench questions) is removed by normalised text match, in code.
"""

from __future__ import annotations

import gzip
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.generate import batch_generate
from mlx_lm.sample_utils import make_sampler

from mlxspec.errors import MlxspecError
from mlxspec.targets.export import to_mlx_lm
from mlxspec.targets.tokenizer import encode_prompt

OWN_PROMPTS = Path(__file__).with_name("distill_prompts.txt")
MAX_PROMPT_TOKENS = 256  # contexts are left-truncated: long prompts would dominate training cost
MIN_POSITIONS = 64  # fewer trained positions than this is not a dataset


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def benchmark_texts(data_dir: Path) -> list[str]:
    """Every turn of every Spec-Bench question, normalised."""
    path = data_dir / "spec_bench_questions.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            out.extend(normalise(t) for t in json.loads(line).get("turns", []))
    return out


def is_benchmark(text: str, bench: list[str], bench_set: set[str] | None = None) -> bool:
    """Equal to a benchmark turn after normalisation, or one contains the other (benchmarks
    quote datasets with extra instructions around them); short texts need an exact match."""
    t = normalise(text)
    if t in (bench_set if bench_set is not None else set(bench)):
        return True
    return len(t) >= 40 and any(t in b or (len(b) >= 40 and b in t) for b in bench)


def _gsm8k(d: Path) -> list[str]:
    return [json.loads(ln)["question"] for ln in (d / "gsm8k_test.jsonl").read_text().splitlines() if ln.strip()]


def _humaneval(d: Path) -> list[str]:
    with gzip.open(d / "humaneval.jsonl.gz", "rt") as f:
        rows = [json.loads(ln) for ln in f if ln.strip()]
    return [f"Complete this Python function.\n\n{r['prompt']}" for r in rows]


def _folio(d: Path) -> list[str]:
    rows = [json.loads(ln) for ln in (d / "folio_validation.jsonl").read_text().splitlines() if ln.strip()]
    out = []
    for r in rows:
        premises = r["premises"] if isinstance(r["premises"], list) else [r["premises"]]
        out.append("Premises:\n" + "\n".join(f"- {p}" for p in premises)
                   + f"\nDoes it follow that: {r['conclusion']}? Explain step by step.")
    return list(dict.fromkeys(out))


def _mt_bench(d: Path) -> list[str]:
    rows = [json.loads(ln) for ln in (d / "mt_bench_questions.jsonl").read_text().splitlines() if ln.strip()]
    return [t for r in rows for t in r.get("turns", [])[:1]]


SOURCES: dict[str, Callable[[Path], list[str]]] = {
    "gsm8k": _gsm8k, "humaneval": _humaneval, "folio": _folio, "mt_bench": _mt_bench,
}


def training_prompts(data_dir: Path, limit: int, seed: int = 0) -> tuple[list[dict[str, str]], dict[str, int]]:
    """Up to ``limit`` prompts, interleaved across sources so a small limit still mixes
    domains, benchmark questions removed. Returns the prompts and how many each source lost."""
    bench = benchmark_texts(data_dir)
    bench_set = set(bench)
    rng = np.random.default_rng(seed)
    pools: dict[str, list[str]] = {}
    dropped: dict[str, int] = {}
    own = [ln.strip() for ln in OWN_PROMPTS.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    candidates = {"own": own}
    for name, read in SOURCES.items():
        try:
            candidates[name] = read(data_dir)
        except FileNotFoundError:
            continue
    for name, texts in candidates.items():
        kept = [t for t in texts if not is_benchmark(t, bench, bench_set)]
        dropped[name] = len(texts) - len(kept)
        pools[name] = [kept[i] for i in rng.permutation(len(kept))]
    out: list[dict[str, str]] = []
    while len(out) < limit and any(pools.values()):
        for name, pool in pools.items():
            if pool and len(out) < limit:
                out.append({"source": name, "text": pool.pop()})
    return out, dropped


@dataclass
class DistillSet:
    """Sequences (prompt + continuation) and the teacher at every continuation position.

    Sequence s's continuation positions predict tokens ``prompt_lens[s] .. len(tokens[s])-1``;
    their teacher rows are ``offsets[s] .. offsets[s+1]-1`` of ``teacher_logp`` (log p at T=1
    over ``vocab_ids``) and ``teacher_argmax`` (full-vocabulary token ids)."""

    tokens: list[np.ndarray]
    prompt_lens: np.ndarray
    vocab_ids: np.ndarray
    teacher_logp: np.ndarray
    teacher_argmax: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def offsets(self) -> np.ndarray:
        gen = np.array([len(t) for t in self.tokens]) - self.prompt_lens
        return np.concatenate([[0], np.cumsum(gen)])

    @property
    def positions(self) -> int:
        return int(self.teacher_argmax.shape[0])

    def check(self, min_positions: int = MIN_POSITIONS) -> None:
        if not self.tokens or self.positions < min_positions:
            raise MlxspecError(
                f"the distillation set has {len(self.tokens)} sequences and {self.positions} trained positions; "
                f"at least {min_positions} positions are needed (more prompts or --max-new-tokens)")

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".partial.npz")
        np.savez(tmp, tokens=np.concatenate(self.tokens), lengths=np.array([len(t) for t in self.tokens]),
                 prompt_lens=self.prompt_lens, vocab_ids=self.vocab_ids, teacher_logp=self.teacher_logp,
                 teacher_argmax=self.teacher_argmax, meta=np.array(json.dumps(self.meta)))
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: Path) -> DistillSet:
        try:
            z = np.load(path)
            flat, lengths = z["tokens"], z["lengths"]
            tokens = np.split(flat, np.cumsum(lengths)[:-1])
            return cls(tokens, z["prompt_lens"], z["vocab_ids"], z["teacher_logp"], z["teacher_argmax"],
                       json.loads(str(z["meta"])))
        except (OSError, KeyError, ValueError) as e:
            raise MlxspecError(f"{path}: not a distillation set ({e})") from None


def choose_vocab(sequences: list[np.ndarray], size: int, vocab_size: int, always: list[int]) -> np.ndarray:
    """The ``size`` most frequent token ids in the data (``always`` first: end-of-turn tokens
    must be proposable). Ties and unseen slots go to lower ids: BPE ids follow merge order,
    a frequency ranking of the tokenizer's own corpus."""
    counts = np.bincount(np.concatenate(sequences), minlength=vocab_size).astype(np.float64)
    counts[always] = np.inf
    order = np.lexsort((np.arange(vocab_size), -counts))
    return np.sort(order[:size]).astype(np.int32)


def generate_continuations(target, prompts: list[list[int]], max_new: int, temp: float, seed: int,
                           batch: int = 64, progress: Callable[[int, int], None] | None = None) -> list[list[int]]:
    """The target's continuations, batched with mlx-lm's ``batch_generate`` (one batch of B
    sequences costs about as much as a few single ones on this CPU)."""
    ref = to_mlx_lm(target.model)
    mx.random.seed(seed)
    out: list[list[int]] = []
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        r = batch_generate(ref, target.tokenizer, chunk, max_tokens=max_new,
                           sampler=make_sampler(temp=temp), return_token_ids=True,
                           completion_batch_size=batch)
        out.extend(list(t) for t in r.token_ids)
        if progress:
            progress(len(out), len(prompts))
    return out


def teacher_rows(target, seq: np.ndarray, prompt_len: int, vocab_ids: mx.array) -> tuple[np.ndarray, np.ndarray, float]:
    """One teacher-forced target pass: log p over ``vocab_ids`` and the full argmax at each
    continuation position, and the mean probability mass the head vocabulary covers there."""
    logits = target.model(mx.array(seq[None, :-1]), target.model.make_cache())[0, prompt_len - 1 :]
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    rows = logp[:, vocab_ids]
    argmax = mx.argmax(logits, axis=-1)
    covered = mx.exp(rows).sum(axis=-1).mean()
    mx.eval(rows, argmax, covered)
    return np.array(rows.astype(mx.float16)), np.array(argmax).astype(np.int32), covered.item()


def build(target, prompts: list[dict[str, str]], max_new: int, head_vocab: int, seed: int = 0,
          greedy_share: float = 0.5, progress: Callable[[str, int, int], None] | None = None) -> DistillSet:
    """Prompts -> chat-templated ids -> target continuations (a ``greedy_share`` of prompts
    greedy, the rest sampled at T=1, so the draft sees both decoding regimes) -> teacher."""
    if not prompts:
        raise MlxspecError("no training prompts (is ../shared/data there? set MLXSPEC_DATA)")
    t0 = time.perf_counter()
    ids = [encode_prompt(target.tokenizer, [{"role": "user", "content": p["text"]}])[-MAX_PROMPT_TOKENS:]
           for p in prompts]
    n_greedy = int(round(len(ids) * greedy_share))
    report = (lambda i, n: progress("generating", i, n)) if progress else None
    conts = generate_continuations(target, ids[:n_greedy], max_new, 0.0, seed, progress=report)
    done = len(conts)
    report2 = (lambda i, n: progress("generating", done + i, len(ids))) if progress else None
    conts += generate_continuations(target, ids[n_greedy:], max_new, 1.0, seed + 1, progress=report2)
    t_gen = time.perf_counter() - t0
    keep = [i for i, c in enumerate(conts) if c]
    seqs = [np.array(ids[i] + conts[i], dtype=np.int32) for i in keep]
    prompt_lens = np.array([len(ids[i]) for i in keep])
    vocab = choose_vocab(seqs, head_vocab, target.config.vocab_size, list(target.tokenizer.eos_token_ids))
    vocab_mx = mx.array(vocab)
    logps, argmaxes, covered = [], [], []
    for j, (s, p) in enumerate(zip(seqs, prompt_lens)):
        rows, am, cov = teacher_rows(target, s, int(p), vocab_mx)
        logps.append(rows)
        argmaxes.append(am)
        covered.append(cov)
        if progress:
            progress("teacher", j + 1, len(seqs))
    meta = {
        "target": target.name, "prompts": len(seqs), "max_new_tokens": max_new, "head_vocab": head_vocab,
        "greedy_share": greedy_share, "seed": seed,
        "sources": {s: sum(p["source"] == s for p in prompts) for s in dict.fromkeys(p["source"] for p in prompts)},
        "generated_tokens": int(sum(len(c) for c in conts)), "generate_s": round(t_gen, 1),
        "teacher_s": round(time.perf_counter() - t0 - t_gen, 1),
        "head_mass": float(np.average(covered, weights=[len(a) for a in argmaxes])),
    }
    return DistillSet(seqs, prompt_lens, vocab, np.concatenate(logps), np.concatenate(argmaxes), meta)


TRAIN_CONTEXT = 64  # prompt tokens kept before the first trained position when training


def batch_arrays(data: DistillSet, rows: np.ndarray, context: int = TRAIN_CONTEXT) -> dict[str, mx.array]:
    """Sequences ``rows`` as right-padded training arrays: input tokens (B, L), the teacher
    (B, L, N) and its argmax as head columns (-1: outside the head vocabulary), and the
    mask of continuation positions. Only the last ``context`` prompt tokens are kept: the
    loss is on the continuation, and a 1-4 block draft leans on recent tokens, so longer
    prompts would mostly cost time (about 2x per step here)."""
    offsets = data.offsets
    col_of = np.full(int(max(data.vocab_ids.max(), data.teacher_argmax.max())) + 1, -1, dtype=np.int32)
    col_of[data.vocab_ids] = np.arange(len(data.vocab_ids), dtype=np.int32)
    starts = [max(0, int(data.prompt_lens[r]) - 1 - context) for r in rows]
    L = max(len(data.tokens[r]) - 1 - s0 for r, s0 in zip(rows, starts))
    N = data.teacher_logp.shape[1]
    tokens = np.zeros((len(rows), L), np.int32)
    logp = np.full((len(rows), L, N), -30.0, np.float32)  # ~0 probability where nothing is trained
    cols = np.full((len(rows), L), -1, np.int32)
    mask = np.zeros((len(rows), L), np.float32)
    for b, (r, s0) in enumerate(zip(rows, starts)):
        seq, p = data.tokens[r], int(data.prompt_lens[r])
        n, first = len(seq) - 1 - s0, p - 1 - s0
        tokens[b, :n] = seq[s0:-1]
        lo, hi = offsets[r], offsets[r + 1]
        logp[b, first:n] = data.teacher_logp[lo:hi]
        cols[b, first:n] = col_of[data.teacher_argmax[lo:hi]]
        mask[b, first:n] = 1.0
    return {"tokens": mx.array(tokens), "teacher_logp": mx.array(logp), "target_cols": mx.array(cols),
            "mask": mx.array(mask)}
