"""Shared: the package's import graph from the source (every import, function-level ones included, except under
``if TYPE_CHECKING:``)."""
from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "parsl_bft"


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_lines(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                for sub in ast.walk(child):
                    if hasattr(sub, "lineno"):
                        skip.add(sub.lineno)
    return skip


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports (resolved to absolute names)."""
    return set(_imports_of(path))


@functools.cache          # each module parsed once a session: the structure tests ask for every module twice or more
def _imports_of(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            for a in node.names:            # `from . import events`: a submodule
                cand = f"{mod}.{a.name}"
                if (ROOT.parent / cand.replace(".", "/")).with_suffix(".py").exists() or \
                        (ROOT.parent / cand.replace(".", "/") / "__init__.py").exists():
                    out.add(cand)
    return frozenset(out)


def graph() -> dict[str, set[str]]:
    """Module -> the parsl_bft modules it imports."""
    mods = {module_name(p): p for p in ROOT.rglob("*.py")}
    # a module's own parent packages are imported before it whatever it says: not an edge of its own
    return {m: {i for i in imports_of(p) if i in mods and i != m and not m.startswith(i + ".")}
            for m, p in mods.items()}


def third_party(module: str) -> set[str]:
    """The top-level outside packages a module imports."""
    p = ROOT.parent / (module.replace(".", "/") + ".py")
    if not p.exists():
        p = ROOT.parent / module.replace(".", "/") / "__init__.py"
    return {i.split(".")[0] for i in imports_of(p) if not i.startswith("parsl_bft")}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out
