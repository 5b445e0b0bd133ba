"""Helpers for driving Textual apps with ``run_test()`` and a pilot."""

from __future__ import annotations

import asyncio
import time


def run(coro):
    return asyncio.run(coro)


async def wait_for(pilot, cond, timeout: float = 30.0) -> None:
    """Let the app run until ``cond()`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting for the app"
        await pilot.pause(0.02)
