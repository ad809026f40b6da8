"""The package's shape, read from its source with `ast` (nothing is imported).

1. No import cycles among the package's modules. An edge is a module-level import of
   `easyvideor1.*` (those under `if TYPE_CHECKING:` included), to the module named and to the
   package `__init__`s that importing it runs (except the importer's own packages, which are
   already being imported).
2. Own-package imports sit at the top of the module, so its header shows what it depends on.
   Imports inside functions are allowed only in `LAZY_IMPORTS` (the thin CLI modules).
3. One name per thing: a public top-level class, type alias, constant or function is defined in
   one module of the package only (`SHARED_NAMES` lists the deliberate exceptions).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = "easyvideor1"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

# Own-package imports allowed inside functions: the thin CLI modules, for the commands that
# import torch (cache, check-data, eval, train, demo), so that `easyvideor1 --help`, which
# imports every commands module, imports neither torch nor transformers.
LAZY_IMPORTS = {
    # an unknown flag of a command that takes config overrides is answered with the config field
    # it names (`override_hint`), the only path of `easyvideor1` itself that needs the config tree
    "easyvideor1.cli",
    "easyvideor1.curation.commands",
    "easyvideor1.data.commands",
    "easyvideor1.evaluation.commands",
    # the HTML report runs a tool call again only for a page that shows tool turns, so that
    # `easyvideor1 report` on other results never imports torch (the tools' frames need it)
    "easyvideor1.evaluation.html_report",
    "easyvideor1.training.commands",
    "easyvideor1.vision.commands",
}

# Names that several modules define on purpose, and which modules may. Everything else is
# defined in one module and imported everywhere else.
SHARED_NAMES = {
    # cli.py's protocol: every commands module exposes `register(subparsers)` (always called
    # qualified, `commands.register`); `rewards.register(name, fn)` adds a reward family.
    "register": lambda module: module.endswith(".commands") or module == "easyvideor1.rewards.dispatch",
    # The reward families' protocol (STYLE.md): each family module's `score(response, sample,
    # cfg) -> Verdict`, reached qualified (`multiple_choice.score`) through the dispatcher's
    # table; `rewards.score` is that dispatcher.
    "score": lambda module: module.startswith("easyvideor1.rewards."),
}

def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(path.read_text(), filename=str(path))
    return out


MODULES = _modules()


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imported(node: ast.Import | ast.ImportFrom, modules: dict[str, ast.Module]) -> list[str]:
    """The package's modules an import statement names (`from pkg import submodule` included)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == PACKAGE]
    assert not node.level, f"line {node.lineno}: relative import; the package imports itself absolutely"
    base = node.module or ""
    if base.split(".")[0] != PACKAGE:
        return []
    return [base] + [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]


def _walk(node: ast.AST, in_function: bool = False):
    """(import node, inside a function?) for every import statement under `node`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, in_function
        yield from _walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))


def _graph(modules: dict[str, ast.Module] = MODULES) -> dict[str, set[str]]:
    """module -> the modules its module-level imports run (TYPE_CHECKING blocks included)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, tree in modules.items():
        own = set(_ancestors(module))
        for node, in_function in _walk(tree):
            if in_function:
                continue
            for target in _imported(node, modules):
                graph[module].update(t for t in [*_ancestors(target), target]
                                     if t in modules and t != module and t not in own)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _public_names(tree: ast.Module) -> set[str]:
    """Top-level classes and functions, and assigned UPPER_CASE constants and CamelCase type
    aliases, not starting with `_` (a lowercase variable such as `log` is no public name)."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(t, ast.Name) and t.id[0].isupper():
                        names.add(t.id)
    return {n for n in names if not n.startswith("_")}


def _lazy_imports(module: str, modules: dict[str, ast.Module] = MODULES) -> list[str]:
    """`module:line imports ...` for each own-package import inside a function."""
    return [f"{module}:{node.lineno} imports {', '.join(targets)}"
            for node, in_function in _walk(modules[module]) if in_function
            for targets in [_imported(node, modules)] if targets]


def test_the_reader_sees_imports_the_way_python_runs_them():
    """Guards the checks below against passing on a misread tree."""
    modules = {name: ast.parse(source) for name, source in {
        "easyvideor1.a": "from easyvideor1.b.c import X\nclass Y:\n    Z = 1\n",
        "easyvideor1.b": "",
        "easyvideor1.b.c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from easyvideor1 import a\n",
        "easyvideor1.d": "import os\n\ndef f():\n    import easyvideor1.a\n\nclass K:\n    def g(self):\n"
                         "        from easyvideor1.b import c\n",
    }.items()}
    graph = _graph(modules)
    assert graph == {"easyvideor1.a": {"easyvideor1.b", "easyvideor1.b.c"},  # the package __init__ runs too
                     "easyvideor1.b": set(), "easyvideor1.b.c": {"easyvideor1.a"}, "easyvideor1.d": set()}
    assert _cycles(graph) == [["easyvideor1.a", "easyvideor1.b.c"]]
    assert _lazy_imports("easyvideor1.d", modules) == ["easyvideor1.d:4 imports easyvideor1.a",
                                                       "easyvideor1.d:8 imports easyvideor1.b, easyvideor1.b.c"]
    assert _public_names(modules["easyvideor1.a"]) == {"Y"}
    names = ast.parse("log = get()\nLIMIT, Alias = 2, int\nN: int = 3\n_P = 4\ndef run(): ...\ndef _f(): ...\n")
    assert _public_names(names) == {"LIMIT", "Alias", "N", "run"}
    assert len(MODULES) > 50 and "easyvideor1.training.trainer" in MODULES


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles among the package's modules:\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_own_package_imports_sit_at_module_top():
    allowed = LAZY_IMPORTS
    assert allowed <= MODULES.keys(), f"stale allowlist entries: {sorted(allowed - MODULES.keys())}"
    lazy = [line for module in sorted(MODULES.keys() - allowed) for line in _lazy_imports(module)]
    assert not lazy, "own-package imports inside functions (move them to the module top):\n" + "\n".join(lazy)


def test_one_module_per_public_name():
    homes: dict[str, list[str]] = defaultdict(list)
    for module, tree in MODULES.items():
        for name in _public_names(tree):
            if not (name in SHARED_NAMES and SHARED_NAMES[name](module)):
                homes[name].append(module)
    twice = {name: mods for name, mods in homes.items() if len(mods) > 1}
    assert not twice, "names defined in more than one module (one name per thing):\n" + "\n".join(
        f"{name}: {', '.join(mods)}" for name, mods in sorted(twice.items()))
