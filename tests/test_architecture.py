"""The layout keeps its promises: imports go one way, by the layer table in docs/architecture.md.

Every `import` in planner/ and costmodels/ is read, also those inside functions; the table is read
from the document itself, so the document cannot drift from the code without this test failing.
"""

import ast
import os
import re

import networkx as nx
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOTS = ("planner", "costmodels")
TORCH_PACKAGES = {"trace", "runtime", "profile"}
"""The only packages that may import torch themselves."""


def _modules() -> dict[str, str]:
    """Module name -> file path, for every module of the project."""
    out = {}
    for root in ROOTS:
        for folder, _, files in os.walk(os.path.join(REPO, root)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(folder, f)
                    name = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                    out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _layers() -> dict[str, int]:
    """Package -> layer, from the table in docs/architecture.md."""
    with open(os.path.join(REPO, "docs", "architecture.md"), encoding="utf-8") as f:
        text = f.read()
    out = {}
    for number, cells in re.findall(r"^\| (\d+) \| ([^|]+) \|", text, flags=re.M):
        for name in re.findall(r"`([a-z_]+)`", cells):
            out[name] = int(number)
    return out


LAYERS = _layers()


def package_of(module: str) -> str:
    """The table's name for a module: the planner package or top-level module it belongs to,
    ``planner`` for the package root, ``costmodels`` for the cost models."""
    parts = module.split(".")
    if parts[0] == "costmodels":
        return "costmodels"
    return parts[1] if len(parts) > 1 else "planner"


def _imports(path: str, module: str):
    """(target module, line number, inside a function, source line) for each project import."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    lines = source.splitlines()
    tree = ast.parse(source)
    in_function = {n.lineno for fn in ast.walk(tree)
                   if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))}
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                package = module.split(".")
                if not path.endswith("__init__.py"):
                    package = package[:-1]
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]
        for target in targets:
            yield target, node.lineno, node.lineno in in_function, lines[node.lineno - 1]


def _edges():
    """(source module, target module, line, inside a function, source line), project imports."""
    for module, path in MODULES.items():
        for target, line, inside, text in _imports(path, module):
            if target.split(".")[0] in ROOTS:
                while target not in MODULES:  # `import planner.x.y` names a module; keep it
                    target = target.rpartition(".")[0]
                yield module, target, line, inside, text


EDGES = list(_edges())


def test_every_package_is_in_the_layer_table():
    packages = {package_of(m) for m in MODULES}
    assert packages - set(LAYERS) == set(), "add these to docs/architecture.md's layer table"
    assert set(LAYERS) - packages == set(), "the layer table names packages that do not exist"


def test_imports_go_down_the_layers():
    wrong = [f"{src}:{line} imports {dst} ({package_of(src)} is layer "
             f"{LAYERS[package_of(src)]}, {package_of(dst)} is layer {LAYERS[package_of(dst)]})"
             for src, dst, line, _, _ in EDGES
             if package_of(src) != package_of(dst)
             and LAYERS[package_of(dst)] <= LAYERS[package_of(src)]]
    assert wrong == []


def test_no_import_cycles_counting_imports_inside_functions():
    graph = nx.DiGraph((src, dst) for src, dst, _, _, _ in EDGES if src != dst)
    cycles = list(nx.simple_cycles(graph))
    assert cycles == []


def test_every_import_inside_a_function_says_why():
    """Of the project's modules and of libraries alike: a deferred import is there for a reason
    (torch or another heavy library, loaded only when used) and says it."""
    silent = [f"{module}:{line}: {text.strip()}" for module, path in MODULES.items()
              for _, line, inside, text in _imports(path, module)
              if inside and "# lazy:" not in text]
    assert silent == []


def test_torch_stays_in_trace_runtime_and_profile():
    offenders = []
    for module, path in MODULES.items():
        for target, line, _, _ in _imports(path, module):
            if target.split(".")[0] == "torch" and (
                    module.startswith("costmodels") or package_of(module) not in TORCH_PACKAGES):
                offenders.append(f"{module}:{line}")
    assert offenders == []


def test_costmodels_imports_only_itself():
    assert [(s, d) for s, d, _, _, _ in EDGES
            if s.startswith("costmodels") and not d.startswith("costmodels")] == []


def test_tests_mirror_the_package_tree():
    folders = {f for f in os.listdir(os.path.join(REPO, "tests", "planner"))
               if os.path.isdir(os.path.join(REPO, "tests", "planner", f)) and f != "__pycache__"}
    packages = {package_of(m) for m in MODULES if m.count(".") >= 2 or
                os.path.basename(MODULES[m]) == "__init__.py"} - {"planner", "costmodels"}
    assert folders <= packages, f"tests/planner/ folders without a package: {folders - packages}"


def test_the_checker_sees_violations(tmp_path):
    """The reader is not blind: an upward import, a cycle and a silent lazy import are found."""
    src = tmp_path / "m.py"
    src.write_text("import os\n\n\ndef f():\n    from planner.cli.main import main\n    return main\n")
    found = list(_imports(str(src), "planner.solve.m"))
    assert [(t, inside) for t, _, inside, _ in found] == [("os", False), ("planner.cli.main", True)]
    assert LAYERS[package_of("planner.cli.main")] < LAYERS[package_of("planner.solve.m")]
    graph = nx.DiGraph([("a", "b"), ("b", "a")])
    assert list(nx.simple_cycles(graph))


@pytest.mark.parametrize("name,package", [("planner", "planner"), ("planner.api", "api"),
                                          ("planner.search.loop", "search"),
                                          ("costmodels.comm", "costmodels")])
def test_package_names(name, package):
    assert package_of(name) == package
