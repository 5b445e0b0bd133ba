"""Does the UI slow generation down? The same greedy turn, headless (the engine plus text
decoding, as ``mlxspec generate`` does) and inside the chat app, alternating (ABBA order).

    python -m mlxspec.tui.chat.overhead                       # the app under Textual's headless driver
    python -m mlxspec.tui.chat.overhead --terminal            # the app drawing to this terminal (run it in tmux)

Reported per run:
* decode tokens/s: the run's ``Run.decode_tps`` (the engine's timings), wall clock, so whatever
  the app costs between steps counts against it. On a shared machine other processes move it by +-20%.
* process CPU ms per generated token (all threads: BLAS, worker, UI): what the UI adds on top
  of generation, and much less sensitive to other processes' load.
* UI-thread CPU ms per step (app runs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import mlxspec  # noqa: F401  (fast BLAS before mlx)
from mlxspec.core.events import Done, Step
from mlxspec.core.runs import RunCollector
from mlxspec.session import Session, StepText

from .app import ChatApp
from .source import ModelSource, Settings
from .widgets import Prompt

PROMPT = "Write a short story about a robot who learns to paint. Mention the robot's name often."


def headless_run(lm, settings: Settings) -> dict:
    text = StepText(lm.tokenizer)
    session = Session(lm, settings.drafter, settings.k, dtype=lm.dtype)
    cpu = time.process_time()
    run = RunCollector()
    for ev in session.stream([{"role": "user", "content": PROMPT}], settings.params, settings.max_tokens,
                             stop_ids=set()):
        run.add(ev)
        if isinstance(ev, Step):
            for _ in text.pieces(ev):
                pass
        elif isinstance(ev, Done):
            cpu = time.process_time() - cpu
            r = run.run()
            return {"tps": r.decode_tps, "cpu_ms_per_token": cpu * 1e3 / r.generated_tokens}
    raise RuntimeError("no Done event")


class _NoStop(ModelSource):
    """The same turn as ``headless_run``: EOS ignored, so both decode exactly max_tokens."""

    def events(self, messages, settings, keep=True):  # no cache kept either way, as headless_run
        return self.drafting(settings).stream(messages, settings.params, settings.max_tokens,
                                              stop_ids=set())


async def _app_run(pilot, app: ChatApp) -> dict:
    await pilot.press("ctrl+n")
    app.query_one(Prompt).value = PROMPT
    cpu, ui_cpu = time.process_time(), time.thread_time()  # this coroutine runs on the UI thread
    await pilot.press("enter")
    await pilot.pause(0.1)
    while app.running is not None:
        await asyncio.sleep(0.05)
    cpu, ui_cpu = time.process_time() - cpu, time.thread_time() - ui_cpu
    stats = app.stats
    return {"tps": stats.result.decode_tps, "cpu_ms_per_token": cpu * 1e3 / stats.result.generated_tokens,
            "ui_cpu_ms_per_step": ui_cpu * 1e3 / len(stats.steps)}


def measure(pairs: int, settings: Settings, terminal: bool) -> dict:
    from mlxspec.targets import loading

    lm = loading.load("default")
    headless_run(lm, settings)  # warm-up
    app = ChatApp(_NoStop(loaded=lm, baseline_tokens=0), settings)
    runs: dict[str, list[dict]] = {"headless": [], "app": []}

    async def pilot_main(pilot) -> None:
        while app.info is None:
            await pilot.pause(0.05)
        for i in range(pairs):
            # Headless runs happen on the UI thread while the app idles (it draws nothing then).
            if i % 2 == 0:
                runs["headless"].append(headless_run(lm, settings))
            runs["app"].append(await _app_run(pilot, app))
            if i % 2 == 1:
                runs["headless"].append(headless_run(lm, settings))
        app.exit()

    if terminal:
        app.run(auto_pilot=pilot_main)
    else:
        async def run_headless() -> None:
            async with app.run_test(size=(120, 40)) as pilot:
                await pilot_main(pilot)

        asyncio.run(run_headless())
    app.wait_for_worker_exit()

    def col(kind: str, key: str) -> list[float]:
        return [round(r[key], 2) for r in runs[kind]]

    def med(kind: str, key: str) -> float:
        return round(statistics.median(r[key] for r in runs[kind]), 2)

    tps_ratios = [a["tps"] / h["tps"] for a, h in zip(runs["app"], runs["headless"])]
    return {
        "settings": settings.label, "max_tokens": settings.max_tokens, "pairs": pairs,
        "driver": "terminal" if terminal else "textual headless",
        "headless_tps": col("headless", "tps"), "app_tps": col("app", "tps"),
        "app_vs_headless_tps_median_of_pairs": round(statistics.median(tps_ratios), 3),
        "headless_cpu_ms_per_token": col("headless", "cpu_ms_per_token"),
        "app_cpu_ms_per_token": col("app", "cpu_ms_per_token"),
        "app_vs_headless_cpu_per_token": round(med("app", "cpu_ms_per_token") / med("headless", "cpu_ms_per_token"), 3),
        "ui_thread_cpu_ms_per_step": col("app", "ui_cpu_ms_per_step"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m mlxspec.tui.chat.overhead", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=6, help="one headless and one app run each")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--draft", "-d", default="ngram:3")
    ap.add_argument("--k", "-k", type=int, default=4)
    ap.add_argument("--terminal", action="store_true", help="draw to this terminal (run it in tmux)")
    ap.add_argument("--out", type=Path, help="also write the result (JSON) here")
    a = ap.parse_args()
    t0 = time.perf_counter()
    r = measure(a.pairs, Settings(draft=a.draft, k=a.k, max_tokens=a.max_tokens), a.terminal)
    r["wall_s"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(r, indent=2)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
