"""The house rules, checked: the import layering (import-linter, setup.cfg: a handful of
layers by package), no import cycle (counting imports inside functions and under
TYPE_CHECKING), no code reading another object's or module's underscore names, no function
longer than 60 lines, and no mixin."""
from __future__ import annotations

import ast
import builtins
import collections
import subprocess
import sys
from pathlib import Path

import pytest

import localcluster

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]      # the checkout: setup.cfg holds the contract
# The sources as imported (under tox, the installed copy), so the rules check what runs.
PACKAGE = Path(localcluster.__file__).resolve().parent
SOURCES = sorted(PACKAGE.rglob("*.py"))

# The only underscore attributes read on anything but ``self`` or ``cls``: the standard
# library's documented ones (os._exit; sys._getframe and sys._current_frames, in sys's docs),
# and IPython's display protocol, a protocol name like a dunder (Client shows its cluster's).
STDLIB_PRIVATE = {"os._exit", "sys._getframe", "sys._current_frames"}
PROTOCOL_NAMES = {"_repr_html_", "_repr_mimebundle_"}


def test_the_import_layers_hold():
    run = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True))"
    proc = subprocess.run([sys.executable, "-c", run, str(REPO / "setup.cfg")], capture_output=True, text=True,
                          cwd=REPO, timeout=50)
    assert "No module named 'importlinter'" not in proc.stderr, "import-linter is in the test extra: .[test]"
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 kept, 0 broken" in proc.stdout


def layers(cfg: str) -> list:
    """The layers contract of ``cfg`` (setup.cfg's text), top first: each a list of the
    names in it (``|`` or ``:`` between them)."""
    body = cfg.split("[importlinter:contract:layers]")[1].split("layers =", 1)[1]
    out = []
    for line in body.splitlines()[1:]:
        if not line.startswith((" ", "\t")) or not line.strip():
            break
        out.append([n.strip() for n in line.replace(":", "|").split("|")])
    return out


def test_the_layers_are_packages_a_contributor_can_remember():
    """The contract states an intent by package, not today's import graph module by module:
    a dozen layers at most, each naming packages or top-level modules only."""
    found = layers((REPO / "setup.cfg").read_text())
    assert 5 <= len(found) <= 12, found
    deep = [n for layer in found for n in layer if n.count(".") > 1]
    assert not deep, f"name packages (or top-level modules) in the layers, not their modules: {deep}"


def test_every_module_has_a_layer():
    contract = (REPO / "setup.cfg").read_text().split("[importlinter:contract:layers]")[1]
    modules = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts) for p in SOURCES
               if p.name != "__init__.py"}
    missing = sorted(m for m in modules if m not in contract and m.rsplit(".", 1)[0] not in contract.split())
    assert not missing, f"give these a layer in setup.cfg: {missing}"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _violations(source: str) -> list:
    """Every ``X._name`` (not a dunder) where X is not ``self`` or ``cls``, even of the same
    class: an object's fields are written and read by its own methods only. And every
    underscore name imported from a module of ours."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if node.attr in PROTOCOL_NAMES or ast.unparse(node) in STDLIB_PRIVATE:
                continue
            bad.append((node.lineno, node.col_offset, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("localcluster")):
            bad += [(node.lineno, node.col_offset, f"import {a.name}") for a in node.names if _private(a.name)]
    return [f"line {line}: {what}" for line, _, what in sorted(bad)]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_nothing_reads_another_objects_underscore_names(path):
    bad = _violations(path.read_text())
    assert not bad, (f"{path.name} reaches into another object's or module's private names: {bad}. "
                     f"Give that object a public method for what the caller needs.")


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_no_function_is_longer_than_60_lines(path):
    tree = ast.parse(path.read_text())
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 60]
    assert not long, f"{path.name}: split these by role: {long}"


def test_the_rules_catch_what_they_guard():
    assert _violations("from .cluster import _as_exception\n") == ["line 1: import _as_exception"]
    assert _violations("def f(cluster):\n    return cluster._lock\n") == ["line 2: cluster._lock"]
    # another instance of the same class is another object: future.py's old module functions
    assert _violations("class A:\n    def __init__(self):\n        self._x = 1\n    def g(self, other):\n"
                       "        return other._x\n") == ["line 5: other._x"]
    assert _violations("def finish(fut, payload):\n    if fut._cond is None:\n"
                       "        fut._result, fut._state = payload, 'FINISHED'\n") == \
        ["line 2: fut._cond", "line 3: fut._result", "line 3: fut._state"]
    assert _violations("def f(self):\n    return self.cluster._lock\n") == ["line 2: self.cluster._lock"]
    assert _violations("import os, sys\nos._exit(1)\nsys._getframe()\nx._repr_html_()\n"
                       "class A:\n    @classmethod\n    def f(cls):\n        return cls._y, self.__dict__\n") == []
    assert _violations("import os\nos._Environ\n") == ["line 2: os._Environ"]


# --- the import graph: no cycle, counting every import the AST holds ----------------------

def _module_names(package: Path) -> dict:
    """{dotted name: path} for every module under ``package`` (at any depth); a package's
    ``__init__.py`` is named after the package."""
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _imported(node: ast.AST, here: str, is_package: bool, modules: dict) -> set:
    """The modules of ``modules`` that one import statement of module ``here`` imports.
    ``from a import b`` imports module a.b if there is one, else (b is a name in a) a itself;
    an import of a package is one of its ``__init__``, named after the package."""
    def known(name: str) -> "str | None":       # the longest prefix that is one of ours
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    if isinstance(node, ast.Import):
        return {m for a in node.names if (m := known(a.name))}
    if not isinstance(node, ast.ImportFrom):
        return set()
    if node.level:
        base = here.split(".") if is_package else here.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    found = set()
    for a in node.names:
        m = f"{source}.{a.name}" if f"{source}.{a.name}" in modules else known(source)
        if m:
            found.add(m)
    return found


def _import_graph(package: Path) -> dict:
    """{module: the modules of the package it imports}, every import counted: at the top,
    inside functions, under ``if TYPE_CHECKING:``, relative or absolute. (The parents a
    submodule's import implicitly runs are not counted: every module would then import the
    package and its re-exports.)"""
    modules = _module_names(package)
    graph = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            edges |= _imported(node, name, is_package, modules)
        edges.discard(name)
        graph[name] = edges
    return graph


def _cycles(graph: dict) -> list:
    """For each module on a cycle, the shortest cycle through it, written ``a -> b -> a``
    from the cycle's first name (each cycle once)."""
    order, low, on_stack, stack, groups = {}, {}, set(), [], []

    def connect(v: str) -> None:          # Tarjan's algorithm
        order[v] = low[v] = len(order)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in order:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in order:
            connect(v)
    cycles = set()
    for group in groups:
        for start in group:
            cycles.add(_shortest_cycle(graph, group, start))
    return sorted(cycles)


def _shortest_cycle(graph: dict, group: set, start: str) -> str:
    """The shortest way from ``start`` back to it inside ``group``, written from its first name."""
    came_from = {start: None}
    queue = collections.deque([start])
    while queue:                           # breadth first
        v = queue.popleft()
        if start in graph[v]:
            path = [v]
            while came_from[path[-1]] is not None:
                path.append(came_from[path[-1]])
            path.reverse()
            first = path.index(min(path))
            path = path[first:] + path[:first]
            return " -> ".join([*path, path[0]])
        for w in sorted(graph[v] & group):
            if w not in came_from:
                came_from[w] = v
                queue.append(w)
    raise AssertionError(f"{start} is in a strongly connected group without a cycle: {group}")


def test_no_import_cycles():
    cycles = _cycles(_import_graph(PACKAGE))
    assert not cycles, ("import cycles (imports inside functions and under TYPE_CHECKING count): "
                        + "; ".join(cycles) + ". Type the upper module's object with a Protocol "
                        "declared in the lower one, instead of importing it.")


def _package(tmp_path: Path, files: dict) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "pkg"


def test_the_import_graph_reads_every_kind_of_import(tmp_path):
    package = _package(tmp_path, {
        "pkg/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub.deep import Deep\n",
        "pkg/top.py": "from . import low\nfrom .sub import deep, NAME\nimport pkg.sub.deep\nimport os\n",
        "pkg/low.py": "def f():\n    from .sub.deep import x\n",
        "pkg/sub/__init__.py": "NAME = 1\n",
        "pkg/sub/deep.py": "from .. import top\nfrom ..low import g\nfrom pkg import __version__\n"
                           "from . import NAME\n",
    })
    graph = _import_graph(package)
    assert graph == {
        "pkg": {"pkg.sub.deep"},
        "pkg.top": {"pkg.low", "pkg.sub.deep", "pkg.sub"},
        "pkg.low": {"pkg.sub.deep"},
        "pkg.sub": set(),
        "pkg.sub.deep": {"pkg.top", "pkg.low", "pkg", "pkg.sub"},
    }
    assert _cycles(graph) == ["pkg -> pkg.sub.deep -> pkg", "pkg.low -> pkg.sub.deep -> pkg.low",
                              "pkg.sub.deep -> pkg.top -> pkg.sub.deep"]


def test_the_cycle_check_names_the_cycles_it_finds():
    graph = {"lc.client": {"lc.daskgraph", "lc.executor", "lc.cluster"}, "lc.daskgraph": {"lc.future"},
             "lc.future": {"lc.client", "lc.cluster"}, "lc.executor": {"lc.client"}, "lc.cluster": set(),
             "lc.a": {"lc.b"}, "lc.b": {"lc.a"}}
    assert _cycles(graph) == ["lc.a -> lc.b -> lc.a",
                              "lc.client -> lc.daskgraph -> lc.future -> lc.client",
                              "lc.client -> lc.executor -> lc.client"]
    graph["lc.future"] = {"lc.cluster"}
    assert _cycles(graph) == ["lc.a -> lc.b -> lc.a", "lc.client -> lc.executor -> lc.client"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


# --- no mixin: a class of ours inherits from one class of ours at most ----------------------

def _class_bases(sources: list) -> dict:
    """Class name -> the names of its bases (a dotted base by its last part), for every class
    the sources define."""
    found: dict = {}
    for text in sources:
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, set()).update(
                    ast.unparse(b.value if isinstance(b, ast.Subscript) else b).rpartition(".")[2] for b in node.bases)
    return found


def _mixins(sources: list) -> list:
    """``Class(A, B)`` for each class with more than one base that is a class of ours, not an
    exception and not a typing Protocol (an exception may add a builtin kind: ``TimeoutError``)."""
    bases = _class_bases(sources)

    def exception(name: str, seen: frozenset = frozenset()) -> bool:
        kind = getattr(builtins, name, None)
        if isinstance(kind, type) and issubclass(kind, BaseException):
            return True
        return name not in seen and any(exception(b, seen | {name}) for b in bases.get(name, ()))

    def ours(name: str) -> bool:
        return name in bases and "Protocol" not in bases[name] and not exception(name)
    bad = [f"{name}({', '.join(sorted(b for b in found if ours(b)))})" for name, found in sorted(bases.items())
           if sum(map(ours, found)) > 1]
    return bad


def test_no_class_is_a_mixin_of_ours():
    bad = _mixins([p.read_text() for p in SOURCES])
    assert not bad, (f"classes built from several classes of ours: {bad}. Give the class the "
                     f"other as a part it holds (composition), as the scheduler's parts are.")


def test_the_mixin_check_finds_one():
    base = "import typing\nclass A: pass\nclass B: pass\nclass P(typing.Protocol): pass\n"
    assert _mixins([base, "class C(A, B): pass\n"]) == ["C(A, B)"]
    assert _mixins([base, "class C(A, P): pass\nclass D(A, object): pass\n"]) == []
    errors = "class E(Exception): pass\nclass F(E, TimeoutError): pass\nclass G(RuntimeError, F): pass\n"
    assert _mixins([base, errors]) == []
    assert _mixins([base, "class H(A, typing.Generic[int], B): pass\n"]) == ["H(A, B)"]


# --- folders by role: at most 12 modules loose at the top of the package ---------------------

LOOSE_AT_MOST = 12


def _loose(package: Path) -> list:
    return sorted(p.name for p in package.glob("*.py") if p.name != "__init__.py")


def test_at_most_12_modules_sit_loose_at_the_top_of_the_package():
    loose = _loose(PACKAGE)
    assert len(loose) <= LOOSE_AT_MOST, (
        f"{len(loose)} modules sit beside localcluster/__init__.py: {loose}. Put a new one in the folder of "
        f"its role (client/, engine/, scheduler/, supervision/, worker/, wire/, system/, views/, "
        f"integrations/), or make a folder for a role that has none")


def test_the_count_of_loose_modules_sees_a_new_one(tmp_path):
    for name in ("__init__.py", *(f"m{i}.py" for i in range(LOOSE_AT_MOST + 1))):
        (tmp_path / name).write_text("")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "inner.py").write_text("")
    assert len(_loose(tmp_path)) == LOOSE_AT_MOST + 1
