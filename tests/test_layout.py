"""The layout is the architecture: ``clockwork/`` (outside ``clockwork/cluster/``) is the
vocabulary both sides speak and imports nothing from ``controller/`` or ``worker/``;
``controller/`` and ``worker/`` never import each other; only ``clockwork/cluster/`` (and
``clockwork/__main__.py``, the command's entry point, and experiments/tests) put the sides
together; and no module imports, directly or through
others, itself. Every import statement counts, also those inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("clockwork", "controller", "worker")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (REPO / pkg).rglob("*.py"):
            if f.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            out[_module_name(f)] = f
    return out


def _imports(name: str, path: Path) -> set[str]:
    """Every module this one imports (absolute names, resolved relative imports)."""
    tree = ast.parse(path.read_text(), str(path))
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        deps = set()
        for imp in _imports(name, path):
            # the longest known module that the import names (a.b.c -> a.b if c is a name)
            while imp and imp not in mods:
                imp = imp.rpartition(".")[0]
            if imp and imp != name:
                deps.add(imp)
        graph[name] = deps
    return graph


def _side(mod: str) -> str:
    # (``clockwork/__main__.py``, ``python -m clockwork``, is the command's entry point, as
    # ``clockwork/cluster/cli`` is: the composition root's side, nobody's import)
    if (mod == "clockwork.cluster" or mod.startswith("clockwork.cluster.")
            or mod == "clockwork.__main__"):
        return "cluster"
    return mod.split(".")[0]


def test_dependency_rule():
    allowed = {"clockwork": {"clockwork"}, "controller": {"clockwork", "controller"},
               "worker": {"clockwork", "worker"},
               "cluster": {"clockwork", "controller", "worker", "cluster"}}
    bad = [f"{m} imports {d}" for m, deps in sorted(_graph().items()) for d in sorted(deps)
           if _side(d) not in allowed[_side(m)]]
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    graph = _graph()
    # package __init__ modules are imported on the way to any of their submodules; an edge
    # "package -> its own submodule" is how a package re-exports and is not a cycle here
    cycles = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()

    def strong(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w.startswith(v + "."):
                continue
            if w not in index:
                strong(w)
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
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_graph_is_real():
    """The checker sees the imports it should (so the tests above can fail)."""
    g = _graph()
    assert "controller" in {_side(d) for d in g["clockwork.cluster.sim"]}
    assert "clockwork.profiles" in g["controller.scheduler"]
    assert "worker.memory" in g["worker.devices.cpu"]
