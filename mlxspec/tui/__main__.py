"""``python -m mlxspec.tui``: the chat UI without the ``mlxspec`` CLI (``--demo`` needs no model)."""

from __future__ import annotations

import argparse
import sys

from mlxspec.errors import MlxspecError

from .chat.app import ChatApp, run_chat
from .chat.source import Settings


def _k_arg(text: str) -> int | str:
    """``auto`` or an integer; the range is checked by ``run_chat``, with the CLI's message."""
    return "auto" if text.strip().lower() == "auto" else int(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mlxspec.tui", description="mlxspec chat: speculative decoding, live.")
    # the same option names as `mlxspec chat`
    ap.add_argument("--model", "-m", default="default", help="registry name, .gguf file or mlx-lm folder")
    ap.add_argument("--draft", "-d", default="default", help="default, none, ngram[:N], self:L or a draft path")
    ap.add_argument("--k", "-k", type=_k_arg, default="auto", help="draft tokens per step: auto (the default) or 1..64")
    ap.add_argument("--temp", "-t", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    ap.add_argument("--max-tokens", "-n", type=int, default=512, help="new tokens per answer")
    ap.add_argument("--dtype", default="auto", help="auto, float32, float16, bfloat16, quantized")
    ap.add_argument("--demo", action="store_true", help="scripted fake events, no model (slowed down)")
    a = ap.parse_args(argv)
    try:
        if a.demo:
            from .chat.fake import FakeSource

            ChatApp(FakeSource(delay=0.3), Settings(a.draft, a.k, temp=a.temp, top_p=a.top_p),
                    loading_label="the demo source").run()
        else:
            run_chat(a.model, a.draft, a.k, a.temp, a.top_p, a.max_tokens, a.dtype)
    except MlxspecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
