"""The package's shape, checked from its source: the import rules of docs/developing.md, module and function
sizes, and a docstring on every public name."""
from __future__ import annotations

import ast
from pathlib import Path

import import_graph as ig

MAX_MODULE_LINES = 530          # "~500"; the largest is the orchestrator (its API and the loop)
MAX_FUNCTION_LINES = 60
# function -> why it may be longer (say why here, or split it)
LONG_FUNCTIONS: dict[str, str] = {}


def _modules() -> dict[str, Path]:
    return {ig.module_name(p): p for p in ig.ROOT.rglob("*.py")}


def test_the_import_graph_has_no_cycle():
    assert ig.cycles(ig.graph()) == []


def test_lower_layers_never_import_higher_ones():
    """planner/idle/sim know nothing of the runtime; train/ knows nothing of the orchestrator; the site schema
    builds nothing; nothing imports the CLI; the planner imports no Parsl and the runtime no MILP solver."""
    g = ig.graph()
    science = ("parsl_bft.idle", "parsl_bft.planner", "parsl_bft.sim")
    runtime = ("parsl_bft.execution", "parsl_bft.train", "parsl_bft.remote")
    bad = []
    for m, deps in g.items():
        ups = {d for d in deps if (m.startswith(science) and d.startswith(runtime))
               or (m.startswith("parsl_bft.train") and d.startswith(("parsl_bft.execution", "parsl_bft.remote")))
               or (m in ("parsl_bft.sites", "parsl_bft.site_schema") and d.startswith(runtime))
               or d == "parsl_bft.cli"}
        bad += [f"{m} -> {d}" for d in sorted(ups)]
        outside = ig.third_party(m)
        if m.startswith("parsl_bft.planner") and "parsl" in outside:
            bad.append(f"{m} -> parsl")
        if m.startswith(("parsl_bft.execution", "parsl_bft.train")) and outside & {"pulp", "highspy"}:
            bad.append(f"{m} -> {sorted(outside & {'pulp', 'highspy'})}")
    assert bad == []


def test_no_module_is_over_the_size_limit():
    big = {m: n for m, p in _modules().items() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert big == {}


def _functions(tree: ast.AST, prefix: str = ""):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{prefix}{node.name}", node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")


def test_no_function_is_over_the_size_limit():
    long = {}
    for m, p in _modules().items():
        for name, f in _functions(ast.parse(p.read_text())):
            n = f.end_lineno - f.lineno + 1
            if n > MAX_FUNCTION_LINES and f"{m}.{name}" not in LONG_FUNCTIONS:
                long[f"{m}.{name}"] = n
    assert long == {}


def _public(tree: ast.Module):
    """Top-level public classes and functions, and public methods of public classes."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            yield node.name, node
            if isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and not sub.name.startswith("_"):
                        yield f"{node.name}.{sub.name}", sub


def test_every_public_name_has_a_docstring():
    missing = []
    for m, p in sorted(_modules().items()):
        tree = ast.parse(p.read_text())
        if not ast.get_docstring(tree) and p.read_text().strip():
            missing.append(m)
        for name, node in _public(tree):
            overload = any(ast.unparse(d).endswith(("overload", "setter")) for d in node.decorator_list)
            if not ast.get_docstring(node) and not overload:
                missing.append(f"{m}.{name}")
    assert missing == []
