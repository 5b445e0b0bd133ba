"""Helpers shared by test modules that drive the CLI (``mlxspec.cli.app`` under Typer's runner).

Test modules import shared helpers from here (or from tests/tiny.py, tests/exact.py,
tests/pilot.py), never from another ``test_*.py`` (tests/test_layout.py checks that)."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from mlxspec.cli import app

runner = CliRunner()


def invoke(*args, **kw):
    """``mlxspec ARGS...`` in process; the runner's ``Result``."""
    return runner.invoke(app, list(args), **kw)


def one_line_error(result, pattern):
    """The command failed as bad input does: exit status 2, one line ``error: ...`` matching
    ``pattern``, no traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert re.search(pattern, lines[0]), lines[0]
