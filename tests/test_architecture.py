"""ARCHITECTURE.md cites only names that exist: every class, function, ``Class.member``
and file it names is looked up in the package's source (AST, not import: a private
method counts, and nothing runs)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import localcluster

pytestmark = pytest.mark.timeout(30)

REPO = Path(__file__).resolve().parent.parent
PACKAGE = Path(localcluster.__file__).resolve().parent
PAGE = REPO / "ARCHITECTURE.md"


def _index() -> tuple[dict, set]:
    """Class name -> its members (methods, class attributes, self.x it assigns); and every
    module-level name (functions, classes, assignments) and method name."""
    classes: dict = {}
    names: set = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            members = classes.setdefault(node.name, set())
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    members.add(sub.name)
                    names.add(sub.name)
                elif isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) \
                        and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                    members.add(sub.attr)
                elif isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name):
                    members.add(sub.target.id)
                elif isinstance(sub, ast.Assign):
                    members.update(t.id for t in sub.targets if isinstance(t, ast.Name))
    return classes, names


def cited(text: str) -> tuple[set, set]:
    """(names, paths) the page cites: each `span` that is a name, Class.member, name() or a
    file or folder; and every Class.member in the text, the diagram's included."""
    names, paths = set(), set()
    for span in re.findall(r"`([^`\n]+)`", text):
        if re.fullmatch(r"[\w/]+\.(py|cfg|md)|\w+/", span):
            paths.add(span)
        elif re.fullmatch(r"[A-Z_][A-Za-z0-9_]*(\.\w+)?|\w+\(\)", span):
            names.add(span)
    names.update(re.findall(r"\b[A-Z][A-Za-z0-9]*\.[A-Za-z_]\w*\b", text))
    return names, paths


def _exists(name: str, classes: dict, names: set) -> bool:
    if name.endswith("()"):
        return name[:-2] in names
    if "." in name:
        cls, member = name.split(".", 1)
        return member in classes.get(cls, ())
    return name in names or name in classes


def test_every_name_the_architecture_page_cites_exists():
    classes, names = _index()
    cited_names, cited_paths = cited(PAGE.read_text())
    assert len(cited_names) > 60, sorted(cited_names)        # the page is read, not skipped
    missing = sorted(n for n in cited_names if not _exists(n, classes, names))
    assert not missing, f"ARCHITECTURE.md cites names that do not exist: {missing}"
    gone = sorted(p for p in cited_paths
                  if not any((base / p).exists() for base in (PACKAGE, REPO, *PACKAGE.iterdir())))
    assert not gone, f"ARCHITECTURE.md cites files that do not exist: {gone}"


def test_the_check_catches_a_name_that_is_not_there():
    classes, names = _index()
    fake, _ = cited("`Dispatcher.bind` and Supervisor.watch_channel and `Nanny.cork` and `frobnicate()`")
    assert fake == {"Dispatcher.bind", "Supervisor.watch_channel", "Nanny.cork", "frobnicate()"}
    assert not any(_exists(n, classes, names) for n in fake)
    real, _ = cited("`Dispatcher.event`, Future.settle, `Lifecycle`, `classify()`, `_MAKING`")
    assert all(_exists(n, classes, names) for n in real), real


def test_each_package_docstring_names_each_of_its_modules():
    """A package's docstring is its table of contents: every module in it is named there."""
    missing = {}
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        names = [m.name for m in sorted(init.parent.glob("*.py")) if m.name != "__init__.py"]
        left = [n for n in names if f"``{n}``" not in doc]
        if left:
            missing[init.parent.name] = left
    assert not missing, f"modules not named in their package's docstring: {missing}"
