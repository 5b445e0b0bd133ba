"""Does the UI slow generation down? Decode tokens/s of the same greedy turn, headless (the
engine plus text decoding, as ``mlxspec generate`` does) and inside the chat app, alternating.

    python -m tui.overhead                       # the app under Textual's headless driver
    python -m tui.overhead --terminal            # the app drawing to this terminal (run in tmux)

Both figures are the engine's own ``Done.decode_tps``, which is wall-clock: time the consumer
spends between steps (posting messages, and in the app the rendering competing for the CPU
and the GIL) counts against it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import mlxspec  # noqa: F401  (fast BLAS before mlx)
from mlxspec.drafters import make_drafter
from mlxspec.engine import generate
from mlxspec.events import Done, Status, Step
from mlxspec.sampling import SamplingParams
from mlxspec.tokenizer import encode_prompt, stop_token_ids

from .app import ChatApp
from .source import ModelSource, Settings
from .widgets import Prompt

PROMPT = "Write a short story about a robot who learns to paint. Mention the robot's name often."


def headless_tps(lm, settings: Settings) -> float:
    tok = lm.tokenizer
    ids = encode_prompt(tok, [{"role": "user", "content": PROMPT}])
    detok = tok.detokenizer
    detok.reset()
    drafter = make_drafter(settings.drafter, lm, lm.dtype)
    for ev in generate(lm.model, ids, SamplingParams(settings.temp), settings.max_tokens, set(),
                       lm.context_length, 0, drafter, settings.k):
        if isinstance(ev, Step):
            for t in ev.tokens:
                if t.status is Status.REJECTED:
                    tok.decode([t.id])
                else:
                    detok.add_token(t.id)
        elif isinstance(ev, Done):
            return ev.decode_tps
    raise RuntimeError("no Done event")


class _NoStop(ModelSource):
    """The same turn as ``headless_tps``: EOS ignored, so both decode exactly max_tokens."""

    def events(self, messages, settings):
        from mlxspec.engine import generate as run

        lm = self.lm
        ids = encode_prompt(lm.tokenizer, messages)
        return run(lm.model, ids, SamplingParams(settings.temp), settings.max_tokens, set(),
                   lm.context_length, 0, self.drafter(settings.drafter), settings.k)


async def _app_turns(pilot, app: ChatApp, n: int, between) -> list[tuple[float, float]]:
    """``n`` app turns, each after one call of ``between``; (decode tok/s, UI-thread CPU ms
    per step) for each."""
    out = []
    while app.info is None:
        await pilot.pause(0.05)
    for _ in range(n):
        between()
        await pilot.press("ctrl+n")
        app.query_one(Prompt).value = PROMPT
        cpu = time.thread_time()  # this coroutine runs on the UI thread
        await pilot.press("enter")
        await pilot.pause(0.1)
        while app.running is not None:
            await asyncio.sleep(0.05)
        cpu = time.thread_time() - cpu
        out.append((app.stats.result.decode_tps, cpu * 1e3 / len(app.stats.steps)))
    return out


def measure(repeats: int, settings: Settings, terminal: bool) -> dict:
    from mlxspec import loading

    lm = loading.load("default")
    headless_tps(lm, settings)  # warm-up
    heads: list[float] = []
    app = ChatApp(_NoStop(loaded=lm, baseline_tokens=0), settings)
    # Alternate: one headless run before each app turn, on the UI thread while the app idles.
    between = lambda: heads.append(headless_tps(lm, settings))  # noqa: E731
    result: dict = {}

    async def pilot_main(pilot) -> None:
        result["app"] = await _app_turns(pilot, app, repeats, between)
        app.exit()

    if terminal:
        app.run(auto_pilot=pilot_main)
    else:
        async def run_headless() -> None:
            async with app.run_test(size=(120, 40)) as pilot:
                await pilot_main(pilot)

        asyncio.run(run_headless())
    app.wait_for_worker_exit()
    apps = [tps for tps, _ in result["app"]]
    ratios = [a / h for a, h in zip(apps, heads)]
    return {"settings": settings.label, "max_tokens": settings.max_tokens, "pairs": repeats,
            "driver": "terminal" if terminal else "textual headless",
            "headless_tps": [round(x, 2) for x in heads], "app_tps": [round(x, 2) for x in apps],
            "pair_ratios": [round(x, 3) for x in ratios],
            "headless_median": round(statistics.median(heads), 2), "app_median": round(statistics.median(apps), 2),
            "app_vs_headless_median_of_pairs": round(statistics.median(ratios), 3),
            "ui_thread_cpu_ms_per_step": [round(c, 1) for _, c in result["app"]]}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tui.overhead", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=5, help="headless/app runs, alternating")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--draft", default="ngram:3")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--terminal", action="store_true", help="draw to this terminal (run it in tmux)")
    ap.add_argument("--json", help="also write the result here")
    a = ap.parse_args()
    t0 = time.perf_counter()
    r = measure(a.pairs, Settings(draft=a.draft, k=a.k, max_tokens=a.max_tokens), a.terminal)
    r["wall_s"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(r, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
