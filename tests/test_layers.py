"""The house rules, checked: the import layering (import-linter, setup.cfg), no module
reading another module's underscore names, and no function longer than 60 lines."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import localcluster

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parent.parent      # the checkout: setup.cfg holds the contract
# The sources as imported (under tox, the installed copy), so the rules check what runs.
PACKAGE = Path(localcluster.__file__).resolve().parent
SOURCES = sorted(PACKAGE.rglob("*.py"))

# Underscore names that belong to the standard library, not to another module of ours:
# os._exit, sys._getframe and sys._current_frames (documented in sys), and the internals
# of concurrent.futures.Future that future.py's subclass reads on its own instances.
STDLIB_PRIVATE = {"_exit", "_condition", "_result", "_exception", "_getframe", "_current_frames"}


def test_the_import_layers_hold():
    run = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True))"
    proc = subprocess.run([sys.executable, "-c", run, str(REPO / "setup.cfg")], capture_output=True, text=True,
                          cwd=REPO, timeout=50)
    assert "No module named 'importlinter'" not in proc.stderr, "import-linter is in the test extra: .[test]"
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 kept, 0 broken" in proc.stdout


def test_every_module_has_a_layer():
    contract = (REPO / "setup.cfg").read_text().split("[importlinter:contract:layers]")[1]
    modules = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts) for p in SOURCES
               if p.name != "__init__.py"}
    missing = sorted(m for m in modules if m not in contract and m.rsplit(".", 1)[0] not in contract.split())
    assert not missing, f"give these a layer in setup.cfg: {missing}"


def _own_names(tree: ast.AST) -> set:
    """Underscore names a module defines: functions, classes, assignments, attributes it sets."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)          # __slots__ entries
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _violations(source: str) -> list:
    tree = ast.parse(source)
    own = _own_names(tree)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            if node.attr not in own and node.attr not in STDLIB_PRIVATE:
                bad.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("localcluster")):
            bad += [f"line {node.lineno}: import {a.name}" for a in node.names if _private(a.name)]
    return bad


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_no_module_reads_another_modules_underscore_names(path):
    bad = _violations(path.read_text())
    assert not bad, f"{path.name} reaches into other modules' private names: {bad}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_no_function_is_longer_than_60_lines(path):
    tree = ast.parse(path.read_text())
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 60]
    assert not long, f"{path.name}: split these by role: {long}"


def test_the_rules_catch_what_they_guard():
    assert _violations("from .cluster import _as_exception\n") == ["line 1: import _as_exception"]
    assert _violations("def f(cluster):\n    return cluster._lock\n") == ["line 2: ._lock"]
    assert _violations("class A:\n    def __init__(self):\n        self._x = 1\n    def g(self, other):\n"
                       "        return other._x\n") == []          # its own class's attribute
