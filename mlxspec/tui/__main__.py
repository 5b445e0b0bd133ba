"""``python -m mlxspec.tui``: the chat UI without the ``mlxspec`` CLI (``--demo`` needs no model)."""

from __future__ import annotations

import argparse
import sys

from mlxspec.core.sampling import SamplingParams
from mlxspec.errors import MlxspecError

from .chat.app import ChatApp, run_chat
from .chat.source import Settings


def _k_arg(text: str) -> int | str:
    """``auto`` or an integer; the range is checked by ``run_chat``, with the CLI's message."""
    return "auto" if text.strip().lower() == "auto" else int(text)


def _tree(a: argparse.Namespace):
    """``--tree`` / ``--tree-nodes`` checked as ``mlxspec chat`` checks them: a shape or None."""
    from mlxspec.core.tree import parse_tree

    if a.tree is None:
        if a.tree_nodes is not None:
            raise MlxspecError("--tree-nodes caps a --tree; give --tree DxB too")
        return None
    if a.k is not None:
        raise MlxspecError("give --k or --tree, not both: a tree's depth is its K")
    return parse_tree(a.tree, a.tree_nodes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mlxspec.tui", description="mlxspec chat: speculative decoding, live.")
    # the same option names as `mlxspec chat`
    ap.add_argument("--model", "-m", default="default", help="registry name, .gguf file or mlx-lm folder")
    ap.add_argument("--draft", "-d", default="default", help="default, none, ngram[:N], self:L or a draft path")
    ap.add_argument("--k", "-k", type=_k_arg, default=None, help="draft tokens per step: auto (the default) or 1..64")
    ap.add_argument("--tree", default=None, help="draft DxB token trees (e.g. 3x2) instead of chains")
    ap.add_argument("--tree-nodes", type=int, default=None, help="cap the --tree at N nodes, breadth first")
    ap.add_argument("--temp", "-t", type=float, default=None,
                    help="sampling temperature (0 = greedy; default: the model's recommended)")
    ap.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass (default: the model's recommended)")
    ap.add_argument("--max-tokens", "-n", type=int, default=512, help="new tokens per answer")
    ap.add_argument("--dtype", default="auto", help="auto, float32, float16, bfloat16, quantized")
    ap.add_argument("--demo", action="store_true", help="scripted fake events, no model (slowed down)")
    a = ap.parse_args(argv)
    try:
        tree = _tree(a)
        k = "auto" if a.k is None else a.k
        if a.demo:
            from .chat.fake import SCRIPT, TREE_SCRIPT, FakeSource

            ChatApp(FakeSource(TREE_SCRIPT if tree else SCRIPT, delay=0.3),
                    Settings(a.draft, 4 if tree else k, params=SamplingParams(a.temp or 0.0, a.top_p or 1.0), tree=tree),
                    loading_label="the demo source").run()
        else:
            run_chat(a.model, a.draft, k, a.temp, a.top_p, a.max_tokens, a.dtype, **({"tree": tree} if tree else {}))
    except MlxspecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
