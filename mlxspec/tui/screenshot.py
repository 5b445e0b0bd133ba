"""Make docs/chat.svg (and docs/chat.png with ``rsvg-convert``): one turn on the default model.

    python -m mlxspec.tui.screenshot [--out docs/chat] [--demo] [--tree 3x2 [--tree-nodes 8]]

``--demo --tree 3x2 --tree-nodes 8 --out docs/chat-tree`` makes docs/chat-tree.png.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
from pathlib import Path

from .chat.app import ChatApp
from .chat.source import ModelSource, Settings
from .chat.widgets import Prompt

PROMPT = "Here is a Python function:\ndef add(a, b):\n    return a + b\nRewrite it with type hints."
TREE_PROMPT = "What is tree speculation?"


def svg_to_png(svg: Path) -> Path | None:
    """The PNG beside ``svg``, when rsvg-convert is installed."""
    if not shutil.which("rsvg-convert"):
        return None
    # rsvg collapses the SVG's leading non-breaking spaces unless told to preserve space.
    fixed = re.sub(r"<svg ", '<svg xml:space="preserve" ', svg.read_text(), count=1)
    png = svg.with_suffix(".png")
    subprocess.run(["rsvg-convert", "-o", str(png)], input=fixed.encode(), check=True)
    return png


async def _shoot(app: ChatApp, svg: Path, size: tuple[int, int], prompt: str = PROMPT) -> None:
    async with app.run_test(size=size) as pilot:
        while app.info is None:
            await pilot.pause(0.1)
        app.query_one(Prompt).value = prompt
        await pilot.press("enter")
        await pilot.pause(0.2)
        while app.running is not None:
            await pilot.pause(0.1)
        await pilot.press("ctrl+r")  # rejected drafts shown, struck through
        await pilot.pause(0.2)
        svg.write_text(app.export_screenshot(title="mlxspec chat"))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m mlxspec.tui.screenshot")
    ap.add_argument("--out", default="docs/chat", help="path without extension")
    ap.add_argument("--demo", action="store_true", help="the scripted fake source instead of the model")
    ap.add_argument("--tree", default=None, help="draft DxB trees: the tree panel shows the last one")
    ap.add_argument("--tree-nodes", type=int, default=None, help="cap the --tree at N nodes")
    a = ap.parse_args()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    from mlxspec.core.tree import parse_tree

    tree = parse_tree(a.tree, a.tree_nodes) if a.tree else None
    if a.demo:
        from .chat.fake import SCRIPT, TREE_SCRIPT, FakeSource

        src = FakeSource(TREE_SCRIPT if tree else SCRIPT)
        app = ChatApp(src, Settings(tree=tree), clock=src.clock)
    else:
        app = ChatApp(ModelSource("default", baseline_tokens=8),
                      Settings(draft="ngram:3", k=4, max_tokens=64, tree=tree))
    svg = out.with_suffix(".svg")
    asyncio.run(_shoot(app, svg, (120, 40), TREE_PROMPT if tree and a.demo else PROMPT))
    app.wait_for_worker_exit()
    print(f"wrote {svg}")
    png = svg_to_png(svg)
    if png:
        print(f"wrote {png}")


if __name__ == "__main__":
    main()
