"""The package's shape (hcp_tune/__init__.py): imports point down the layers, the job side
imports nothing of the orchestrator but the contract, and no import cycle exists.

Every import counts, including those inside functions: each of the three cycles this
package once had (memory fit -> plan -> predict -> memory fit, gpucheck <-> its Bridge
step, the Bridge runner <-> the job entry) closed only through a function-level import.
"""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "hcp_tune"

# The orchestrator's layers, lowest first; a module may import its own layer and those below.
LAYERS = ("contract", "upstream", "config", "space", "costmodel", "stats", "store", "engine",
          "outputs", "top")
CONTRACT = {"hcp_tune", "hcp_tune.spec", "hcp_tune.errors", "hcp_tune.noise", "hcp_tune.flops",
            "hcp_tune.merge", "hcp_tune.redact", "hcp_tune.packing"}
TOP = {"hcp_tune.cli", "hcp_tune.__main__", "hcp_tune.calibrate", "hcp_tune.results"}
# The orchestrator -> job edges that must exist, each with its reason.
ORCHESTRATOR_TO_JOB = {
    ("hcp_tune.config.settings", "hcp_tune.job.bridge.config"):
        "runner.bridge_overrides are parsed at load by the parser the job uses",
    ("hcp_tune.engine.dispatch", "hcp_tune.job.steps"): "the steps driver's StepLaunch record",
    ("hcp_tune.engine.pools", "hcp_tune.job.pool"):
        "a kept allocation's folder names and batch files, both sides alike",
    ("hcp_tune.engine.sweep", "hcp_tune.job.payload"): "the payload functions submitit pickles",
    ("hcp_tune.engine.launch", "hcp_tune.job.payload"): "the payload functions submitit pickles",
}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at module level or inside functions.
    ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``."""
    pkg = root.name
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    here = here[:len(here) - (node.level - 1)]
                    base = ".".join(here + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base
                           for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in files:  # import a.b.c of a module a.b.c's package
                    t = t.rpartition(".")[0]
                if t.split(".")[0] == pkg and t != mod:
                    deps.add(t)
        graph[mod] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def layer(mod: str) -> str:
    if mod in CONTRACT:
        return "contract"
    if mod in TOP or mod.startswith("hcp_tune.gpucheck"):
        return "top"
    if mod.startswith("hcp_tune.job"):
        return "job"
    sub = mod.split(".")[1]
    assert sub in LAYERS, f"{mod}: in no layer; add its package to LAYERS or CONTRACT"
    return sub


GRAPH = import_graph(PKG)


def test_the_package_has_no_import_cycle():
    assert cycles(GRAPH) == []


def test_the_cycle_check_counts_imports_inside_functions(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.a import x\n")
    (pkg / "c.py").write_text("from . import a\n")
    assert cycles(import_graph(pkg)) == [["pkg.a", "pkg.b"]]
    (pkg / "b.py").write_text("def f():\n    return 1\n")
    assert cycles(import_graph(pkg)) == []


def test_orchestrator_imports_point_down_the_layers():
    up = [f"{m} ({layer(m)}) imports {d} ({layer(d)})"
          for m, deps in sorted(GRAPH.items()) if layer(m) not in ("job",)
          for d in sorted(deps) if layer(d) != "job"
          and LAYERS.index(layer(d)) > LAYERS.index(layer(m))]
    assert up == []


def test_job_side_imports_only_the_contract():
    bad = [f"{m} imports {d}" for m, deps in sorted(GRAPH.items()) if layer(m) == "job"
           for d in sorted(deps) if layer(d) not in ("job", "contract")]
    assert bad == []


def test_contract_imports_only_the_contract():
    bad = [f"{m} imports {d}" for m in sorted(CONTRACT) for d in sorted(GRAPH[m])
           if d not in CONTRACT]
    assert bad == []


def test_orchestrator_reaches_the_job_side_only_through_the_listed_edges():
    edges = {(m, d) for m, deps in GRAPH.items() if layer(m) not in ("job", "top")
             for d in deps if layer(d) == "job"}
    assert edges == set(ORCHESTRATOR_TO_JOB)
