"""The package layering of ``src/specserve`` (docs/design.md, "Layers"), checked from the source.

Every ``import``/``from … import`` of ``specserve.*`` counts: at module level, inside
functions and under ``TYPE_CHECKING`` alike (a type-only dependency is still one a reader
must follow). Three rules:

* no import cycle between modules (and so none between packages);
* a package imports only from its own layer or the layers below it;
* ``bench``, ``report`` and ``quality`` speak HTTP and files: they never import the engine,
  the server, the models or the speculative code (``bench`` may load a tokenizer to count
  tokens).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "specserve"

# Bottom to top. A top-level module or package (the first name after ``specserve.``) may
# import from its own layer and any layer below; ``__init__`` is the root package (version).
LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(layer)
    for layer in (
        {"__init__", "config", "sampling_params", "yaml_config", "paths", "net", "dtypes"},
        {"sampling"},
        {"models"},
        {"loading"},
        {"kv_cache"},
        {"spec_decode"},
        {"engine"},
        {"server"},
        {"bench"},
        {"report", "quality"},
        {"experiment", "tune", "deploy", "perf", "train"},
        {"commands"},
        {"cli"},
    )
)
# What the HTTP-only packages may import besides the leaves of the first layer.
HTTP_ONLY: Mapping[str, frozenset[str]] = {
    "bench": frozenset({"bench", "loading"}),  # loading: the tokenizer of --tokenizer
    "report": frozenset({"report", "bench"}),
    "quality": frozenset({"quality"}),  # HTTP to the endpoints; code runs in a subprocess
}
MAX_MODULE_LINES = 400


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str, known: Iterable[str]) -> set[str]:
    """The ``specserve`` modules that the file at ``path`` (module ``name``) imports."""
    known = set(known)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "specserve")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.split(".")[0] != "specserve":
                continue
            for alias in node.names:  # ``from pkg import module`` names a module
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    # The nearest known module of each name (``import a.b.c`` of a package path).
    resolved = set()
    for dep in found:
        while dep not in known and "." in dep:
            dep = dep.rpartition(".")[0]
        if dep in known and dep != name:
            resolved.add(dep)
    return resolved


def import_graph(root: Path = SRC) -> dict[str, set[str]]:
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    return {name: imports_of(path, name, files) for name, path in files.items()}


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph.get(start, ())))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph.get(nxt, ()))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_of(package: str) -> int:
    for i, layer in enumerate(LAYERS):
        if package in layer:
            return i
    raise AssertionError(f"package {package!r} is in no layer: add it to LAYERS")


def violations(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """Imports that break the layer order or the HTTP-only rule."""
    out = []
    for module, deps in sorted(graph.items()):
        src = top(module)
        for dep in sorted(deps):
            dst = top(dep)
            if layer_of(dst) > layer_of(src):
                out.append(f"{module} -> {dep}: {src} may not import the higher layer {dst}")
            elif src in HTTP_ONLY and dst not in HTTP_ONLY[src] | LAYERS[0]:
                out.append(f"{module} -> {dep}: {src} speaks HTTP/files only")
    return out


GRAPH = import_graph()


def test_every_package_has_a_layer() -> None:
    for module in GRAPH:
        layer_of(top(module))


def test_no_import_cycles() -> None:
    assert cycles(GRAPH) == []


def test_layers_are_respected() -> None:
    assert violations(GRAPH) == []


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_no_module_over_the_line_limit(path: Path) -> None:
    assert len(path.read_text(encoding="utf-8").splitlines()) <= MAX_MODULE_LINES


# --- the checker itself finds what it is for --------------------------------------------


def test_cycle_finder_reports_a_cycle_and_only_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_import_parser_counts_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    root = tmp_path / "specserve"
    (root / "low").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "low" / "__init__.py").write_text("")
    (root / "low" / "x.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from specserve.high import y\n"
        "def f():\n    from specserve.high.z import g\n"
    )
    (root / "high").mkdir()
    (root / "high" / "__init__.py").write_text("")
    (root / "high" / "y.py").write_text("from specserve.low import x\n")
    (root / "high" / "z.py").write_text("from . import y\n")
    graph = import_graph(root)
    assert graph["specserve.low.x"] == {"specserve.high.y", "specserve.high.z"}
    assert graph["specserve.high.z"] == {"specserve.high.y"}
    assert cycles(graph) == [["specserve.high.y", "specserve.high.z", "specserve.low.x"]]


def test_layer_rule_flags_an_upward_and_an_http_only_import() -> None:
    graph = {
        "specserve.models.decoder": {"specserve.engine.llm_engine"},
        "specserve.bench.client": {"specserve.server.app"},
        "specserve.engine.llm_engine": {"specserve.models.decoder"},
    }
    found = violations(graph)
    assert len(found) == 2
    assert "models may not import the higher layer engine" in found[1]
    assert "bench speaks HTTP/files only" in found[0]
