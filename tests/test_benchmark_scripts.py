"""Every script in benchmarks/ still imports against the package, does no work at import, and
calls mlxspec's functions by names and arguments that exist. No test runs these scripts (each
takes minutes to hours on the real model), so without this a renamed function or keyword in
mlxspec breaks them silently until someone tries to reproduce a BENCHMARKS.md table."""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import inspect
import re
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))
HAS_TORCH = importlib.util.find_spec("torch") is not None


def tree_of(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def needs_torch(tree: ast.Module) -> bool:
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    return any(m.split(".")[0] == "torch" or m.startswith("mlxspec.torchpath") for m in names)


def is_main_guard(node: ast.stmt) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
            and len(node.test.comparators) == 1
            and isinstance(node.test.comparators[0], ast.Constant)
            and node.test.comparators[0].value == "__main__")


def load_script(path: Path, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """Import the script from its path under a private name. argv holds an option no script
    accepts, so a script that parsed arguments at import would exit here."""
    name = f"_benchmark_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setattr(sys, "argv", [str(path), "--no-such-option"])
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses look their module up here
    monkeypatch.syspath_prepend(str(path.parent))  # as `python benchmarks/x.py` runs: its siblings import
    spec.loader.exec_module(module)
    return module


def test_there_are_scripts():
    assert SCRIPTS, "benchmarks/*.py found nothing: the test would pass vacuously"


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_script_does_no_work_at_import(path: Path):
    """Top level: a docstring, imports, definitions, constants, and one `if __name__ ==
    "__main__": main()` at the end."""
    body = tree_of(path).body
    assert body and is_main_guard(body[-1]), f"{path.name} does not end with a __main__ guard"
    guard = body[-1]
    assert [ast.unparse(s) for s in guard.body] == ["main()"], f"{path.name}: the guard should only call main()"
    for node in body[:-1]:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # docstring
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and not any(
                isinstance(n, ast.Call) for n in ast.walk(node.value)):
            continue  # a constant
        pytest.fail(f"{path.name}:{node.lineno} runs at import: {ast.unparse(node)[:80]}")
    assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in body), f"{path.name} has no main()"


def mlxspec_callee(module: types.ModuleType, func: ast.expr):
    """The mlxspec object a call names (`name(...)` imported from mlxspec, or `alias.name(...)`
    on an imported mlxspec module), else None."""
    if isinstance(func, ast.Name):
        obj = module.__dict__.get(func.id)
    elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        owner = module.__dict__.get(func.value.id)
        if not (isinstance(owner, types.ModuleType) and owner.__name__.startswith("mlxspec")):
            return None
        assert hasattr(owner, func.attr), f"{owner.__name__} has no {func.attr}"
        obj = getattr(owner, func.attr)
    else:
        return None
    if obj is None or not callable(obj):
        return None
    return obj if getattr(obj, "__module__", "").startswith("mlxspec") else None


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_script_imports_and_its_calls_into_mlxspec_bind(path: Path, monkeypatch: pytest.MonkeyPatch):
    tree = tree_of(path)
    if needs_torch(tree) and not HAS_TORCH:
        pytest.skip("the torch extra is not installed: pip install 'mlxspec[torch]'")
    module = load_script(path, monkeypatch)
    assert callable(getattr(module, "main", None))
    assert inspect.signature(module.main).bind() is not None  # the guard calls main() bare
    checked = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        target = mlxspec_callee(module, node.func)
        if target is None or any(isinstance(a, ast.Starred) for a in node.args) or any(
                k.arg is None for k in node.keywords):
            continue
        try:
            sig = inspect.signature(target)
        except (TypeError, ValueError):
            continue
        try:
            sig.bind(*node.args, **{k.arg: k.value for k in node.keywords})
        except TypeError as e:
            pytest.fail(f"{path.name}:{node.lineno} {ast.unparse(node.func)}(...) no longer binds: {e}")
        checked += 1
    uses_mlxspec = any(isinstance(n, ast.ImportFrom) and (n.module or "").startswith("mlxspec")
                       for n in ast.walk(tree))
    assert checked or not uses_mlxspec, f"{path.name} imports from mlxspec but no call was checked"


BENCHMARKS = ROOT / "BENCHMARKS.md"
RESULTS = ROOT / "benchmarks" / "results"


def expand_braces(token: str) -> list[str]:
    """`a-{1,2}.json` -> a-1.json, a-2.json (nested and repeated groups too)."""
    start = token.find("{")
    if start < 0:
        return [token]
    end = token.index("}", start)
    return [x for alt in token[start + 1:end].split(",")
            for x in expand_braces(token[:start] + alt + token[end + 1:])]


def cited_result_names(text: str) -> set[str]:
    """File names in backticks (`name.json`, `draft-study/{a,b}-*.json`), braces expanded."""
    tokens = re.findall(r"`([^`\s]+\.(?:json|png|txt|csv))`", text)
    return {name for t in tokens for name in expand_braces(t)}


def result_files() -> list[str]:
    return sorted(p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*") if p.is_file())


def test_benchmarks_md_is_the_current_answers_not_a_notebook():
    lines = BENCHMARKS.read_text().splitlines()
    assert len(lines) <= 250, f"BENCHMARKS.md has {len(lines)} lines: history goes to benchmarks/notes/"
    assert not [ln for ln in lines if "§" in ln], "section numbers belong to the dated notes"


def test_every_result_file_benchmarks_md_names_exists():
    """Outside code blocks (where --out names what a command would write), every file named in
    backticks is in benchmarks/results/."""
    prose = re.sub(r"```.*?```", "", BENCHMARKS.read_text(), flags=re.DOTALL)
    files = result_files()
    missing = [n for n in sorted(cited_result_names(prose))
               if not any(fnmatch.fnmatch(f, n) or fnmatch.fnmatch(f, "*/" + n) for f in files)]
    assert not missing, f"BENCHMARKS.md cites result files that are not in benchmarks/results/: {missing}"


def test_every_result_file_is_cited_by_benchmarks_md():
    text = BENCHMARKS.read_text()
    names = cited_result_names(text) | set(re.findall(r"benchmarks/results/(\S+)", text))
    uncited = [f for f in result_files()
               if not any(fnmatch.fnmatch(f, n) or fnmatch.fnmatch(f, "*/" + n) for n in names)]
    assert not uncited, f"result files no table cites (remove them, or cite them): {uncited}"


def test_draft_study_sh_uses_commands_and_options_the_cli_has():
    import typer

    from mlxspec.cli import app

    cli = typer.main.get_command(app)
    script = (ROOT / "benchmarks" / "draft_study.sh").read_text()
    calls = re.findall(r"\$M ([a-z-]+)([^\n;|>]*)", script)
    assert calls, "draft_study.sh calls no mlxspec command"
    for name, args in calls:
        assert name in cli.commands, f"draft_study.sh: mlxspec has no command {name}"
        options = {o for p in cli.commands[name].params for o in (*p.opts, *p.secondary_opts)}
        unknown = [o for o in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", args) if o not in options]
        assert not unknown, f"draft_study.sh: mlxspec {name} has no {unknown}"
