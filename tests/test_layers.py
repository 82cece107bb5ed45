"""The house: import-linter's contracts (pyproject.toml) hold, and depthpack's import graph has at most
7 levels and no cycle. A change that breaks a layer fails here with the import named."""
from __future__ import annotations

import ast
import io
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LEVELS = 7


def test_import_linter_contracts_hold():
    from importlinter.cli import lint_imports

    out = io.StringIO()
    with redirect_stdout(out):
        rc = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True)
    assert rc == 0, out.getvalue()[-4000:]


def _module_graph() -> dict[str, set[str]]:
    """module -> depthpack modules it imports (function-level imports too); package faces (an __init__
    that only hands names on) are transparent: importing a name through one imports where it lives."""
    files = {p: ".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "depthpack").rglob("*.py")}
    files = {p: m[: -len(".__init__")] if m.endswith(".__init__") else m for p, m in files.items()}
    mods = {m: p for p, m in files.items()}

    def is_face(p: Path) -> bool:
        tree = ast.parse(p.read_text())
        return p.name == "__init__.py" and not any(isinstance(n, (ast.FunctionDef, ast.ClassDef)) for n in tree.body)

    def targets(m: str, p: Path) -> set[str]:
        pkg = m.split(".") if p.name == "__init__.py" else m.split(".")[:-1]
        out = set()
        for node in ast.walk(ast.parse(p.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
                names = [f"{base}.{a.name}" for a in node.names] + [base]
            for t in names:
                while t and t not in mods and "." in t:
                    t = t.rpartition(".")[0]
                if t in mods and t != m:
                    out.add(t)
        return out

    graph = {m: targets(m, p) for m, p in mods.items()}
    faces = {m for m, p in mods.items() if is_face(p)}
    resolved: dict[str, set[str]] = {}
    for m in graph:
        if m in faces:
            continue
        seen, todo, deps = set(), list(graph[m]), set()
        while todo:
            t = todo.pop()
            if t in seen:
                continue
            seen.add(t)
            if t in faces:
                todo += graph[t]
            else:
                deps.add(t)
        resolved[m] = deps
    return resolved


def test_import_graph_has_at_most_seven_levels_and_no_cycle():
    graph = _module_graph()
    level: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> int:
        if m in level:
            return level[m]
        assert m not in stack, f"import cycle: {' -> '.join(stack[stack.index(m):] + [m])}"
        stack.append(m)
        level[m] = 1 + max((visit(t) for t in graph[m]), default=0)
        stack.pop()
        return level[m]

    for m in sorted(graph):
        visit(m)
    top = max(level.values())
    chain, m = [], max(level, key=level.get)
    while True:
        chain.append(m)
        nxt = [t for t in graph[m] if level[t] == level[m] - 1]
        if not nxt:
            break
        m = sorted(nxt)[0]
    assert top <= MAX_LEVELS, f"{top} levels: {' -> '.join(chain)}"
    assert "depthpack.core.model" in graph and level["depthpack.core.packing"] == 1
