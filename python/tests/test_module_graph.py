"""The package's modules import each other without a cycle, counting the
imports made only for type checking: each module can be read after the
ones it names, never before them."""

import ast
import pathlib

import kvgate

PACKAGE = pathlib.Path(kvgate.__file__).parent


def imports_of(path: pathlib.Path) -> set:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                names.add(node.module.split(".")[0])
            else:
                names.update(alias.name for alias in node.names)
    return names


def test_no_module_imports_one_that_imports_it_back():
    modules = {p.stem: p for p in PACKAGE.glob("*.py")}
    graph = {name: imports_of(path) & modules.keys() for name, path in modules.items()}
    assert graph["_gate"] >= {"_attempt", "_lease", "_asyncio"}, "the graph is read"
    done, on_path = set(), []

    def visit(name):
        if name in on_path:
            cycle = on_path[on_path.index(name):] + [name]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        on_path.append(name)
        for target in sorted(graph[name]):
            visit(target)
        on_path.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)
