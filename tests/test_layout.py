"""The package's shape: no module reaches for another's private names, no import cycle
(counting imports inside functions, which only defer a cycle to run time), the layers import one
way only, and the two backends' ``ops`` modules export the same names."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mlxspec",)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), str(p))
            for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def absolute(name: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = name.split(".")
    is_package = (ROOT / Path(*base) / "__init__.py").exists()
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(name: str, tree: ast.Module, known: set[str]) -> list[tuple[str, str | None]]:
    """(module imported, name taken from it or None) for every import of our own modules."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.split(".")[0] in PACKAGES]
        elif isinstance(node, ast.ImportFrom):
            src = absolute(name, node)
            if src.split(".")[0] not in PACKAGES:
                continue
            for a in node.names:
                sub = f"{src}.{a.name}"
                out.append((sub, None) if sub in known else (src, a.name))
    return out


def test_no_module_imports_another_modules_private_names():
    mods = modules()
    known = set(mods)
    bad = []
    for name, tree in mods.items():
        aliases = {}
        for src, taken in imports(name, tree, known):
            if taken and taken.startswith("_") and not taken.startswith("__") and src != name:
                bad.append(f"{name}: from {src} import {taken}")
        for node in ast.walk(tree):  # module objects bound by import, then `module._name`
            if isinstance(node, ast.ImportFrom):
                src = absolute(name, node)
                for a in node.names:
                    if f"{src}.{a.name}" in known:
                        aliases[a.asname or a.name] = f"{src}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in known:
                        aliases[a.asname or a.name] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_") and not node.attr.startswith("__")):
                bad.append(f"{name}: {aliases[node.value.id]}.{node.attr}")
    assert not bad, "private names used across modules:\n" + "\n".join(bad)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the DFS stack, 2 done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_no_import_cycles():
    mods = modules()
    known = set(mods)
    graph = {name: {src for src, _ in imports(name, tree, known) if src in known and src != name}
             for name, tree in mods.items()}
    # A package's __init__ re-exporting its own submodules is not a cycle of behaviour.
    graph = {n: {m for m in deps if not (n.startswith(m + ".") and m in known)} for n, deps in graph.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# Lowest first; a module may import from its own layer or a lower one, never a higher one.
LAYERS = (
    ("core", ("mlxspec.core", "mlxspec.runtime", "mlxspec.errors", "mlxspec")),
    ("torchpath", ("mlxspec.torchpath",)),
    ("targets", ("mlxspec.targets",)),
    ("session", ("mlxspec.session",)),
    ("training", ("mlxspec.training",)),
    ("measure", ("mlxspec.measure",)),
    ("faces", ("mlxspec.cli", "mlxspec.flags", "mlxspec.terminal", "mlxspec.printer", "mlxspec.serve", "mlxspec.tui")),
)


def layer(module: str) -> int:
    """The index in ``LAYERS`` of the most specific prefix naming ``module``."""
    best, depth = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and p.count(".") > depth:
                best, depth = i, p.count(".")
    assert best is not None, f"{module} is in no layer"
    return best


def layer_violations(mods: dict[str, ast.Module]) -> list[str]:
    known = set(mods)
    return sorted({f"{name} ({LAYERS[layer(name)][0]}) -> {src} ({LAYERS[layer(src)][0]})"
                   for name, tree in mods.items() for src, _ in imports(name, tree, known)
                   if layer(src) > layer(name)})


def test_layers_import_one_way():
    """core < torchpath < targets < session < training < measure < faces (cli, serve, tui),
    imports inside functions included."""
    bad = layer_violations(modules())
    assert not bad, "imports from a higher layer:\n" + "\n".join(bad)


def signatures(module) -> dict[str, tuple[tuple[str, str], ...] | None]:
    """Each name of ``module.__all__`` -> its parameters (name, kind) where it has a signature
    (None for a constant or a compiled function without one, such as ``mx.eval``: nothing to
    compare there)."""
    out = {}
    for n in module.__all__:
        try:
            out[n] = tuple((p.name, p.kind.name) for p in inspect.signature(getattr(module, n)).parameters.values())
        except (TypeError, ValueError):
            out[n] = None
    return out


def signature_differences(a: dict, b: dict) -> list[str]:
    diff = [f"only in one: {n}" for n in sorted(set(a) ^ set(b))]
    diff += [f"{n}: {a[n]} vs {b[n]}" for n in sorted(set(a) & set(b))
             if a[n] is not None and b[n] is not None and a[n] != b[n]]
    return diff


def test_both_backends_ops_export_the_same_names_and_signatures():
    """``core.ops`` and ``torchpath.ops`` are the backend seam: the engine and the drafters call
    either through the same names with the same parameters."""
    pytest.importorskip("torch")
    from mlxspec.core import ops as mlx_ops
    from mlxspec.torchpath import ops as torch_ops

    mlx_names, torch_names = signatures(mlx_ops), signatures(torch_ops)
    mlx_names.pop("ops_for")  # picks a model's backend; only MLX's module needs it
    diff = signature_differences(mlx_names, torch_names)
    assert not diff, "core.ops and torchpath.ops differ:\n" + "\n".join(diff)
    for module in (mlx_ops, torch_ops):  # what the seam offers is listed
        public = {n for n in vars(module) if not n.startswith("_") and n not in module.__all__
                  and getattr(getattr(module, n), "__module__", module.__name__) == module.__name__
                  and not isinstance(getattr(module, n), type(ast))}
        assert not public - {"annotations"}, f"{module.__name__} defines {sorted(public)} outside __all__"


def test_the_checks_can_fail():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    tree = ast.parse("from mlxspec.core.engine import _secret\n")
    assert ("mlxspec.core.engine", "_secret") in imports("mlxspec.cli", tree, set(modules()))
    # A lower layer reaching up, even from inside a function, is caught.
    mods = modules()
    mods["mlxspec.core.engine"] = ast.parse("def f():\n    from mlxspec.measure import runs\n")
    assert "mlxspec.core.engine (core) -> mlxspec.measure.runs (measure)" in layer_violations(mods)
    assert layer("mlxspec") == 0 and layer("mlxspec.session") == 3 and layer("mlxspec.tui.chat.app") == 6

    def tokens(ids, device=None): ...

    a = signatures(SimpleNamespace(__all__=["tokens", "x"], tokens=tokens, x=1))
    b = signatures(SimpleNamespace(__all__=["tokens"], tokens=lambda ids: ids))
    assert signature_differences(a, b) == [
        "only in one: x", "tokens: (('ids', 'POSITIONAL_OR_KEYWORD'), ('device', 'POSITIONAL_OR_KEYWORD')) "
        "vs (('ids', 'POSITIONAL_OR_KEYWORD'),)"]


def test_core_knows_nothing_of_files_measurements_training_or_ui():
    """Data flows one way: core/ is imported by the rest and imports none of it."""
    mods = modules()
    known = set(mods)
    outside = ("mlxspec.targets", "mlxspec.measure", "mlxspec.training", "mlxspec.cli", "mlxspec.tui")
    bad = [f"{name} imports {src}" for name, tree in mods.items() if name.startswith("mlxspec.core")
           for src, _ in imports(name, tree, known) if src.startswith(outside)]
    assert not bad, "\n".join(bad)


def test_no_test_module_imports_another():
    """Helpers two test modules share live in a helper module (tests/helpers.py, tiny.py,
    exact.py, pilot.py), never in a test_*.py another one imports: importing a test module runs
    its collection-time code and, under pytest, can collect its tests twice."""
    test_modules = {p.stem for p in (ROOT / "tests").glob("test_*.py")}

    def imported(tree: ast.Module) -> set[str]:
        out = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                out |= {a.name.split(".")[-1] if a.name.startswith("tests.") else a.name.split(".")[0]
                        for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                module = (node.module or "").split(".")
                if module == ["tests"] or module == [""]:  # from tests import x / from . import x
                    out |= {a.name for a in node.names}
                else:
                    out.add(module[1] if module[0] == "tests" and len(module) > 1 else module[0])
        return out & test_modules

    bad = [f"tests/{p.name} imports {', '.join(sorted(found))}"
           for p in sorted((ROOT / "tests").glob("test_*.py"))
           if (found := imported(ast.parse(p.read_text(), str(p))) - {p.stem})]
    assert not bad, "\n".join(bad) + "\n(move what they share into a helper module under tests/)"
    # the check sees every spelling of such an import
    for line in ("from test_cli import invoke", "import test_cli", "from tests.test_cli import invoke",
                 "import tests.test_cli as t", "from .test_cli import invoke", "from tests import test_cli",
                 "from . import test_cli", "def f():\n    from test_cli import invoke"):
        assert imported(ast.parse(line)) == {"test_cli"}, line
    assert imported(ast.parse("from helpers import invoke\nimport tiny\nfrom mlxspec import cli")) == set()


def face_leaks(mods: dict[str, ast.Module]) -> list[str]:
    """Imports by which a decoding face (what shows a reply: the printer, the server, the chat)
    leans on the measurement wing, or the server on the chat."""
    known = set(mods)
    faces = ("mlxspec.printer", "mlxspec.serve", "mlxspec.tui.chat")
    return sorted(f"{name} imports {src}" for name, tree in mods.items() if name.startswith(faces)
                  for src, _ in imports(name, tree, known)
                  if src.startswith("mlxspec.measure") or (name.startswith("mlxspec.serve") and src.startswith("mlxspec.tui")))


def test_decoding_faces_import_nothing_from_measure():
    """Serve, the chat and ``generate``'s printer read the reply record from core; a change to a
    measurement cannot break them."""
    assert not (bad := face_leaks(modules())), "\n".join(bad)
    mods = modules()  # the check can fail
    mods["mlxspec.serve.reply"] = ast.parse("from mlxspec.tui.chat import app\nfrom mlxspec.measure.runs import Run\n")
    assert face_leaks(mods) == ["mlxspec.serve.reply imports mlxspec.measure.runs",
                                "mlxspec.serve.reply imports mlxspec.tui.chat.app"]


MODULE_LINES, FUNCTION_LINES, CLI_LINES, COMMAND_BODY_LINES = 600, 60, 500, 25


def over_budget(sources: dict[str, str]) -> list[str]:
    """Modules over ``MODULE_LINES``, functions (signature to last line) over ``FUNCTION_LINES``."""
    bad = []
    for name, text in sources.items():
        if (n := text.count("\n")) > MODULE_LINES:
            bad.append(f"{name}: {n} lines")
        bad += [f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines" for node in ast.walk(ast.parse(text))
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node.end_lineno - node.lineno + 1 > FUNCTION_LINES]
    return bad


def command_bodies(text: str) -> dict[str, int]:
    """Each CLI command (a function decorated with ``app.command`` or a sub-app's ``command``)
    -> the lines of its body after the docstring: what the command does beyond taking flags."""
    out = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and any(
                "command" in ast.unparse(d) for d in node.decorator_list):
            body = node.body[1:] if ast.get_docstring(node) else node.body
            out[node.name] = node.end_lineno - body[0].lineno + 1
    return out


def test_modules_and_functions_stay_within_their_budgets():
    sources = {module_name(p): p.read_text() for p in sorted((ROOT / "mlxspec").rglob("*.py"))}
    assert not (bad := over_budget(sources)), "over budget:\n" + "\n".join(bad)
    long_function = "def f():\n" + "    x = 1\n" * FUNCTION_LINES  # the check can fail
    assert over_budget({"m": long_function}) == [f"m.f: {FUNCTION_LINES + 1} lines"]


def test_the_cli_is_a_thin_door():
    """cli.py parses flags and calls one entry point per command: the work lives in the modules."""
    text = (ROOT / "mlxspec" / "cli.py").read_text()
    assert text.count("\n") <= CLI_LINES
    bodies = command_bodies(text)
    assert len(bodies) >= 10, "the command finder found too few commands"
    assert not (long := {n: b for n, b in bodies.items() if b > COMMAND_BODY_LINES}), long


def family_lists(trees: dict[str, ast.Module], families: set[str]) -> list[str]:
    """Modules holding a literal collection that names 3 or more model families."""
    out = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
            if not isinstance(node, (ast.Dict, ast.List, ast.Tuple, ast.Set)) or items is None:
                continue
            named = {i.value for i in items if isinstance(i, ast.Constant) and i.value in families}
            if len(named) >= 3:
                out.append(f"{name}:{node.lineno} {sorted(named)}")
    return out


def test_model_families_are_listed_once():
    """A new family is one row of ``targets.families.FAMILIES``: no other module keeps its own list."""
    from mlxspec.targets.families import FAMILIES

    trees = {n: t for n, t in modules().items() if n != "mlxspec.targets.families"}
    copies = family_lists(trees, set(FAMILIES))
    assert not copies, "family lists outside targets/families.py:\n" + "\n".join(copies)
    copy = ast.parse('SUPPORTED = ("llama", "qwen2", "qwen3")')  # the check can fail
    assert family_lists({"m": copy}, set(FAMILIES)) == ["m:1 ['llama', 'qwen2', 'qwen3']"]
