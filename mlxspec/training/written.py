"""The target's own answers to the corpus's prompts, as training examples for an eagle head.

A head drafts along text the target writes, but the corpus's responses are written by people:
along them the target's features come from prefixes it would not have produced. Teacher
forcing over the target's own answers (half greedy, half sampled at T = 1, the two regimes a
user decodes in) gives the head the features it meets when drafting. A second answer to each
prompt (``flipped``) takes the other regime, so twice as many answers never repeat one.
Answers are generated in batches (on torch: ~230 tokens/s here, against ~40 for mlx-lm's
batched generation on MLX's CPU backend) and cached in shards keyed by their prompts, so a
build resumes and a larger set reuses a smaller one's answers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from mlxspec.core.ops import ops_for
from mlxspec.targets.tokenizer import encode_prompt
from mlxspec.training.corpus import Example
from mlxspec.training.distill import generate_continuations

SHARD = 128  # prompts per cached file
BATCH = 64  # rows per generation batch (similar prompt lengths together)
SUFFIX = " (target)"  # a written example's category: its prompt's, marked


def _continuations(teacher, prompts: list[list[int]], max_new: int, temp: float, seed: int) -> list[list[int]]:
    stop = list(teacher.tokenizer.eos_token_ids)
    if ops_for(teacher.model).name == "torch":
        from mlxspec.torchpath.generate import generate  # imports torch, an optional extra

        out = []
        for i in range(0, len(prompts), BATCH):
            out += generate(teacher.model, prompts[i : i + BATCH], max_new, temp, seed + i, stop)
        return out
    conts = generate_continuations(teacher, prompts, max_new, temp, seed, batch=BATCH)
    return [c[: next((j for j, t in enumerate(c) if t in stop), len(c))] for c in conts]


def _write_shard(teacher, examples: Sequence[Example], max_new: int, seed: int, max_prompt: int,
                 flipped: bool = False) -> list[dict]:
    ids = [encode_prompt(teacher.tokenizer, e.prompt)[-max_prompt:] for e in examples]
    greedy = [(i % 2 == 0) != flipped for i in range(len(examples))]
    answers: dict[int, list[int]] = {}
    for temp in (0.0, 1.0):
        rows = sorted((i for i in range(len(examples)) if greedy[i] == (temp == 0.0)), key=lambda i: len(ids[i]))
        for i, c in zip(rows, _continuations(teacher, [ids[i] for i in rows], max_new, temp, seed)):
            answers[i] = c
    return [{"category": e.category + SUFFIX, "prompt": e.prompt, "response": teacher.tokenizer.decode(answers[i]),
             "source": f"target-{'greedy' if greedy[i] else 'T1'}", "tokens": len(answers[i])}
            for i, e in enumerate(examples)]


def shard_key(target_name: str, examples: Sequence[Example], max_new: int, seed: int, max_prompt: int,
              flipped: bool = False) -> str:
    # An unflipped shard keeps the key it had before second answers existed: caches stay valid.
    h = hashlib.sha256(f"{target_name}|{max_new}|{seed}|{max_prompt}{'|flipped' if flipped else ''}".encode())
    for e in examples:
        h.update(f"{e.category}\x00{e.prompt}\x01".encode())
    return h.hexdigest()[:16]


def written_examples(teacher, examples: Sequence[Example], cache_dir: Path, max_new: int = 128, seed: int = 0,
                     max_prompt: int = 128, progress: Callable[[int, int], None] | None = None,
                     flipped: bool = False) -> list[Example]:
    """The target's answer to each example's prompt (even indices greedy, odd sampled at T = 1;
    ``flipped``: the other way round), as examples of category ``<category> (target)``; answers
    that are empty are left out."""
    out: list[Example] = []
    for start in range(0, len(examples), SHARD):
        chunk = examples[start : start + SHARD]
        path = cache_dir / f"{shard_key(teacher.name, chunk, max_new, seed + start, max_prompt, flipped)}.jsonl"
        if not path.exists():
            rows = _write_shard(teacher, chunk, max_new, seed + start, max_prompt, flipped)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".partial")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
            tmp.replace(path)
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        out += [Example(r["category"], r["prompt"], r["response"], r["source"]) for r in rows if r["tokens"] > 0]
        if progress:
            progress(min(start + SHARD, len(examples)), len(examples))
    return out
