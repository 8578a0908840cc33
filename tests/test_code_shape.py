"""The shape rules ARCHITECTURE.md states, checked on the source: small functions (at most 60 lines,
McCabe complexity at most 15, as flake8's C901 counts it) and the import layering.

bench/ is exempt (one-off measurement scripts), and so are the declarative builders that are one
long list of panels, alerts or recording rules (named in LONG_LISTS): their length is data, their
complexity still counts."""

from __future__ import annotations

import ast
from pathlib import Path

import mccabe
import pytest
from conftest import REPO

MAX_LINES = 60
MAX_COMPLEXITY = 15
CHECKED = ("gpuobs", "tests", "examples")
LONG_LISTS = {  # (file, function): one declarative list; exempt from MAX_LINES only
    ("gpuobs/dashboards/training.py", "build"), ("gpuobs/dashboards/inference.py", "build"),
}


def _sources() -> list[Path]:
    return sorted(p for d in CHECKED for p in (REPO / d).rglob("*.py")
                  if not p.name.endswith(("_pb2.py", "_pb2_grpc.py")))  # protoc's output


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_no_function_is_longer_than_60_lines():
    long = []
    for path in _sources():
        rel = path.relative_to(REPO).as_posix()
        for fn in _functions(ast.parse(path.read_text(), str(path))):
            lines = fn.end_lineno - fn.lineno + 1
            if lines > MAX_LINES and (rel, fn.name) not in LONG_LISTS:
                long.append(f"{rel}:{fn.lineno} {fn.name} ({lines} lines)")
    assert not long, "functions over 60 lines:\n" + "\n".join(long)


def test_no_function_is_more_complex_than_15():
    complex_ = []
    for path in _sources():
        visitor = mccabe.PathGraphingAstVisitor()
        visitor.preorder(ast.parse(path.read_text(), str(path)), visitor)
        complex_ += [f"{path.relative_to(REPO)}:{g.lineno} {g.entity} ({g.complexity()})"
                     for g in visitor.graphs.values() if g.complexity() > MAX_COMPLEXITY]
    assert not complex_, "functions over McCabe complexity 15:\n" + "\n".join(complex_)


@pytest.mark.parametrize("source, expected", [
    ("def f(x):\n" + "".join(f"    if x == {i}:\n        return {i}\n" for i in range(15)) + "    return -1\n", 16),
    ("def f(x):\n    return x\n", 1),
])
def test_the_complexity_measure_counts_branches(source, expected):
    visitor = mccabe.PathGraphingAstVisitor()
    visitor.preorder(ast.parse(source), visitor)
    assert [g.complexity() for g in visitor.graphs.values()] == [expected]


# ARCHITECTURE.md's layers: a gpuobs package or module may import its own package, gpuobs/__init__
# (the version) and packages of lower layers; FORBIDDEN lists same-or-lower-layer imports that are
# still not allowed.
LAYERS = {
    "nvml": 0, "ports": 0, "runenv": 0, "attribution": 0,
    "catalog": 1, "logpatterns": 1, "mig": 1,
    "records": 2, "sim": 2, "logs": 2,
    "collect": 3, "instrument": 3,
    "exporter": 4, "alerts": 4, "dashboards": 4,
    "docs": 5, "smi": 5, "demo": 5, "report": 5,
    "generated": 6,  # `gpuobs generate` runs the alerts, dashboards and docs generators
    "explain": 6,  # `gpuobs explain` reads through report's client and demo's exemplar lookup
    "cli": 7,
}
FORBIDDEN = {("dashboards", "alerts"), ("logs", "instrument")}


def _unit(path: Path) -> str:
    """The top-level gpuobs package or module a source file belongs to."""
    return path.relative_to(REPO / "gpuobs").with_suffix("").parts[0]


def _imported_units(path: Path) -> set[str]:
    """The top-level gpuobs units a module imports (absolute or relative, at any depth)."""
    package = list(path.relative_to(REPO).with_suffix("").parts[:-1])
    units = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name.split(".") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = base + (node.module.split(".") if node.module else [])
            names = [module + [a.name] for a in node.names] if not node.module else [module]
        else:
            continue
        units |= {parts[1] for parts in names if parts[0] == "gpuobs" and len(parts) > 1}
    return units


def test_imports_follow_the_layers():
    units = {_unit(p) for p in (REPO / "gpuobs").rglob("*.py") if _unit(p) != "__init__"}
    assert units <= set(LAYERS), f"add {sorted(units - set(LAYERS))} to LAYERS and to ARCHITECTURE.md"
    wrong = []
    for path in (REPO / "gpuobs").rglob("*.py"):
        unit = _unit(path)
        if unit == "__init__":
            continue
        for target in _imported_units(path) - {unit, "__init__", "__version__"}:
            if LAYERS.get(target, 99) >= LAYERS[unit] or (unit, target) in FORBIDDEN:
                wrong.append(f"{path.relative_to(REPO)} imports gpuobs.{target}")
    assert not wrong, "imports against ARCHITECTURE.md's layers:\n" + "\n".join(sorted(wrong))


def test_the_layering_check_sees_relative_and_absolute_imports():
    module = REPO / "gpuobs" / "collect" / "base.py"
    assert {"catalog", "nvml"} <= _imported_units(module)
    assert "exporter" in _imported_units(REPO / "gpuobs" / "cli.py")


# ------------------------------------------------------------------------------------ import cycles
def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, package: str = "gpuobs") -> dict[str, set[str]]:
    """{module: the modules of `package` it imports, at any depth of its code (a function-level import
    closes a cycle too)}, from the sources under root/package. `from X import name` counts X.name
    when that is a module, else X; a package's __init__ is its package name."""
    paths = {_module_name(p, root): p for p in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        is_package = path.name == "__init__.py"
        here = name.split(".") if is_package else name.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = here[:len(here) - node.level + 1] if node.level else []
                module = ".".join(base + (node.module.split(".") if node.module else []))
                submodules = {f"{module}.{a.name}" for a in node.names} & set(paths)
                targets |= submodules if len(submodules) == len(node.names) else submodules | {module}
        graph[name] = {t for t in targets if t in paths and t != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: every module
    in one can reach every other through imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycle_between_gpuobs_modules():
    graph = import_graph(REPO)
    assert len(graph) > 80 and "gpuobs.sim.smi_fields" in graph["gpuobs.sim.capture"]
    assert not import_cycles(graph), f"import cycles: {import_cycles(graph)}"


def test_the_cycle_check_sees_a_cycle(tmp_path):
    pkg = tmp_path / "gpuobs"
    (pkg / "sim").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sim" / "__init__.py").write_text("")
    (pkg / "sim" / "a.py").write_text("from . import b\n")
    (pkg / "sim" / "b.py").write_text("def f():\n    from .c import g\n")  # a function-level import counts
    (pkg / "sim" / "c.py").write_text("import gpuobs.sim.a\ng = 1\n")
    (pkg / "d.py").write_text("from .sim import a\n")  # imports into the cycle, is not in it
    assert import_cycles(import_graph(tmp_path)) == [["gpuobs.sim.a", "gpuobs.sim.b", "gpuobs.sim.c"]]
    (pkg / "sim" / "c.py").write_text("g = 1\n")
    assert import_cycles(import_graph(tmp_path)) == []


def test_every_test_architecture_md_names_exists():
    """The rules of ARCHITECTURE.md's "Where to add" name the tests that enforce them: each named
    test file and test function exists (a `::test` alone belongs to the file named before it)."""
    import re

    text = (REPO / "ARCHITECTURE.md").read_text()
    named, current = [], None
    for m in re.finditer(r"tests/(\w+\.py)(?:::(\w+))?|(?<![\w/.])::(\w+)", text):
        current = m[1] or current
        if m[2] or m[3]:
            named.append((current, m[2] or m[3]))
        elif m[1]:
            named.append((current, None))
    assert len(named) > 10
    for file, test in named:
        path = REPO / "tests" / file
        assert path.is_file(), f"ARCHITECTURE.md names {file}, which does not exist"
        if test:
            defined = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}
            assert test in defined, f"ARCHITECTURE.md names {file}::{test}, which does not exist"


def _public_definitions(tree: ast.Module):
    """(qualified name, node) of every public module-level function and class, and every public
    method of a public class (public: the name does not start with `_`)."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            yield node.name, node
            if isinstance(node, ast.ClassDef):
                for member in node.body:
                    if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)) and not member.name.startswith("_"):
                        yield f"{node.name}.{member.name}", member


def _undocumented(source: str) -> list[str]:
    return [name for name, node in _public_definitions(ast.parse(source)) if not ast.get_docstring(node)]


def test_every_public_name_in_gpuobs_has_a_docstring():
    # ARCHITECTURE.md: docstrings on public functions and classes (shapes, units, errors, sources)
    missing = [f"{path.relative_to(REPO)}: {name}" for path in _sources() if path.is_relative_to(REPO / "gpuobs")
               for name in _undocumented(path.read_text())]
    assert not missing, f"{len(missing)} public names without a docstring:\n" + "\n".join(missing)


def test_the_docstring_check_sees_functions_classes_and_methods():
    source = ('def f():\n    """Doc."""\ndef g(): pass\ndef _h(): pass\n'
              'class A:\n    def m(self): pass\n    def _n(self): pass\n'
              '    @property\n    def p(self):\n        """Doc."""\n'
              'class _B:\n    def m(self): pass\n')
    assert _undocumented(source) == ["g", "A", "A.m"]
