"""ARCHITECTURE.md is true, as far as names can show: every class, function, ``Class.member``
and file it names exists; on each diagram line through the socket pair the tail writes and
the head reads; the worker's reader runs on the thread the diagram names; each field of the
lock table is touched under its lock or by a function the table lists; the layers are
setup.cfg's. All from the package's source (AST, not import: a private method counts, and
nothing runs)."""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import Any

import pytest

import localcluster

pytestmark = pytest.mark.timeout(30)

REPO = Path(__file__).resolve().parents[2]
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
    real, _ = cited("`Dispatcher.event`, FutureState.conclude, `Lifecycle`, `classify()`, `_MAKING`")
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


# --- the diagram: who reads and who writes each socket pair ------------------------------

def _diagram() -> str:
    text = PAGE.read_text()
    return text.split("```text\n", 1)[1].split("```", 1)[0]


@functools.lru_cache(maxsize=1)
def _methods() -> dict:
    """``Class.method`` -> its FunctionDef, for every method of the package (the first found
    where two classes share a name)."""
    found: dict = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        found.setdefault(f"{node.name}.{sub.name}", sub)
    return found


READS = {"recv_all", "receive", "drain"}             # a channel's reads, both sides


def WRITES(name: str) -> bool:                       # noqa: N802 - a set by its meaning
    """A channel's or a socket's send: send, sendmsg, send_frame, _send_chunks ..."""
    return name.lstrip("_").startswith("send")


def _calls(fn: ast.AST) -> set:
    """The names ``fn`` calls directly (``x.name(...)`` or ``name(...)``)."""
    return {n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id for n in ast.walk(fn)
            if isinstance(n, ast.Call) and isinstance(n.func, (ast.Attribute, ast.Name))}


def _reaches(methods: dict, name: str, wanted: Any, depth: int = 4) -> bool:
    """Whether ``Class.method`` calls one of ``wanted`` (a set, or a test of a name), itself or
    through ``self.x()`` calls."""
    match = wanted if callable(wanted) else wanted.__contains__
    cls = name.split(".")[0]
    seen, todo = set(), [name]
    for _ in range(depth):
        step = []
        for n in todo:
            fn = methods.get(n)
            if fn is None or n in seen:
                continue
            seen.add(n)
            called = _calls(fn)
            if any(map(match, called)):
                return True
            step += [f"{cls}.{c}" for c in called]
        todo = step
    return False


def socket_lines(diagram: str) -> list:
    """(writer, reader) for each diagram line through the socket pair: the last ``Class.method``
    before it and the first after it, in the arrow's direction."""
    name = r"[A-Z]\w*\.\w+"
    out = []
    for line in diagram.splitlines():
        if "socket pair" not in line:
            continue
        before, after = line.split("socket pair", 1)
        left, right = re.findall(name, before), re.findall(name, after)
        if "►" in after and left and right:
            out.append((left[-1], right[0]))
        elif "◄" in before and left and right:
            out.append((right[0], left[-1]))
    return out


def test_on_each_socket_line_the_tail_writes_and_the_head_reads():
    methods = _methods()
    lines = socket_lines(_diagram())
    assert len(lines) >= 3, lines           # both ways, and the lent channel
    for writer, reader in lines:
        assert _reaches(methods, writer, WRITES), f"the diagram has {writer} write the socket pair; it does not"
        assert _calls(methods[reader]) & READS, (f"the diagram names {reader} as the reader of the socket pair; "
                                                 f"it calls none of {sorted(READS)} itself")


def test_the_workers_reader_runs_on_the_thread_the_diagram_names():
    """The diagram says an idle executor reads the worker's channel: the thread started as
    ``localcluster-exec-N`` runs the function named for it, which reaches the reader."""
    methods, diagram = _methods(), _diagram()
    (reader,) = [r for _w, r in socket_lines(diagram) if r.startswith("Worker.")]
    said = re.search(r"on an idle executor \((Worker\.\w+), thread\s+localcluster-exec-N", diagram)
    assert said, "the diagram names the thread that reads the worker's channel"
    target = said.group(1)
    started = [n for n in ast.walk(methods["Worker.serve"]) if isinstance(n, ast.Call)
               and any(k.arg == "target" and ast.unparse(k.value) == f"self.{target.split('.')[1]}" for k in n.keywords)]
    assert started and "localcluster-exec-" in ast.unparse(started[0]), f"{target} is not the executor threads' target"
    assert _reaches(methods, target, {reader.split(".")[1]}), f"{target} never reaches {reader}"


def test_the_diagram_check_refutes_a_wrong_reader():
    methods = _methods()
    (writer, reader), = socket_lines("Dispatcher.post: Channel.flush ──── socket pair ────► Worker.serve (main thread)")
    assert reader == "Worker.serve" and not _calls(methods[reader]) & READS   # the page's old claim
    (writer, reader), = socket_lines("EventLoop.run ◄──── socket pair ──── Worker._queue")
    assert not _calls(methods[reader]) & READS and not _reaches(methods, writer, WRITES)


# --- the lock table: each field touched under its lock, or where the page says -------------

LOCKS = {"the cluster's lock": (("._lock", "._changed", ".locked()"), "caller holds the lock"),
         "its `Nanny.reading`": ((".reading",), "under ``n.reading``")}
EVENTS = {"event", "drive", "_decide"}                # run what they are given under the cluster's lock


def lock_rows(text: str) -> list:
    """(Class, field, lock, [Class.method allowed without it]) for each row of the page's
    table of fields."""
    table = text.split("| field | lock | touched without it by |", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in table.splitlines()[2:]:
        field, lock, without = [c.strip() for c in line.strip().strip("|").split("|")]
        cls, attr = field.strip("`").split(".")
        kind = next(k for k in LOCKS if lock.startswith(k))
        named = re.sub(r"\([^()]*\)", "", without)        # the reasons, in brackets, name other things
        rows.append((cls, attr, kind, re.findall(r"`([A-Z]\w*\.\w+)`", named)))
    return rows


def unlocked(source: str, cls: str, attr: str, kind: str) -> set:
    """``Class.method`` of each access to ``attr`` on ``self`` in class ``cls``, or through a
    collaborator named after it (``self._supervisor.nannies``), outside its lock; a function
    nested in a method goes by the method's name, and ``__init__`` is not counted."""
    spellings, doc_says = LOCKS[kind]
    out: set = set()

    def visit(node, owner, method, locked):
        if isinstance(node, ast.ClassDef):
            owner, method = node.name, None
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if method is None:
                method = node.name
                locked = doc_says in (ast.get_docstring(node) or "").lower()
            elif node.name in events:       # a function handed to an event runs under the lock
                locked = True
        elif isinstance(node, (ast.With, ast.AsyncWith)) and any(
                ast.unparse(i.context_expr).endswith(spellings) for i in node.items):
            locked = True
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in EVENTS:
            visit(node.func, owner, method, locked)
            for a in [*node.args, *node.keywords]:
                visit(a, owner, method, True)
            return
        elif isinstance(node, ast.Attribute) and node.attr == attr and method not in (None, "__init__"):
            on = ast.unparse(node.value)
            if (owner == cls and on == "self") or on.endswith(f"._{cls.lower()}") or (kind != "the cluster's lock"):
                if not locked:
                    out.add(f"{owner}.{method}" if owner else method)
        for child in ast.iter_child_nodes(node):
            visit(child, owner, method, locked)

    tree = ast.parse(source)
    events = {a.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
              and n.func.attr in EVENTS for a in [*n.args, *(k.value for k in n.keywords)] if isinstance(a, ast.Name)}
    visit(tree, None, None, False)
    return out


def test_each_locked_field_is_touched_under_its_lock_or_where_the_page_says():
    rows = lock_rows(PAGE.read_text())
    assert {f"{c}.{a}" for c, a, _k, _w in rows} >= {"Supervisor.nannies", "Supervisor.deaths", "Nanny.left_for_loop"}
    sources = [p.read_text() for p in sorted(PACKAGE.rglob("*.py"))]
    for cls, attr, kind, allowed in rows:
        found = set().union(*(unlocked(s, cls, attr, kind) for s in sources if f".{attr}" in s))
        assert found <= set(allowed), (f"{cls}.{attr} is touched without {kind} by {sorted(found - set(allowed))}: "
                                       f"take the lock there, or say why not in ARCHITECTURE.md's table")
        assert set(allowed) <= found, f"ARCHITECTURE.md lists {sorted(set(allowed) - found)} for {cls}.{attr}: they take the lock"


def test_the_lock_check_sees_an_access_outside_the_lock():
    code = ("class Supervisor:\n"
            "    def a(self):\n        with self._lock:\n            return self.nannies\n"
            "    def b(self):\n        return self.nannies\n"
            "    def c(self):\n        '''Caller holds the lock.'''\n        return self.nannies\n"
            "    def d(self):\n        def run():\n            return self.nannies\n        self._dispatch.event(run)\n"
            "    def e(self):\n        self._decide(lambda: self.nannies)\n"
            "class Gateway:\n    def f(self):\n        return self._supervisor.nannies\n"
            "    def g(self):\n        with self._lock:\n            return self._supervisor.nannies\n")
    assert unlocked(code, "Supervisor", "nannies", "the cluster's lock") == {"Supervisor.b", "Gateway.f"}
    left = "def take(n):\n    with n.reading:\n        n.left_for_loop.pop()\n    n.left_for_loop.append(1)\n"
    assert unlocked(f"class S:\n    def t(self, n):\n        return n.left_for_loop\n{left}", "Nanny",
                    "left_for_loop", "its `Nanny.reading`") == {"S.t", "take"}


def test_the_reading_lock_is_never_taken_under_the_clusters_lock():
    """``Nanny.reading`` first, then the cluster's lock: never the other way round."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if ".reading" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.With, ast.AsyncWith)) and any(
                    ast.unparse(i.context_expr).endswith(LOCKS["the cluster's lock"][0]) for i in node.items):
                inner = [ast.unparse(w.items[0].context_expr) for b in node.body for w in ast.walk(b)
                         if isinstance(w, (ast.With, ast.AsyncWith))]
                bad += [f"{path.name}:{node.lineno}: {w}" for w in inner if w.endswith(".reading")]
    assert not bad, bad


# --- the layers: the page's list is setup.cfg's contract ---------------------------------

def page_layers(text: str) -> list:
    """The page's list of layers, top first: each a list of module names (``|``/``:`` kept)."""
    block = text.split("## Layers", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    out = []
    for line in block.splitlines():
        names = re.split(r"\s{2,}", line.strip(), maxsplit=1)[1]
        out.append(" ".join(f"localcluster.{n}" if n not in "|:" else n for n in names.split()))
    return out


def contract_layers(cfg: str) -> list:
    body = cfg.split("[importlinter:contract:layers]")[1].split("layers =", 1)[1]
    out = []
    for line in body.splitlines()[1:]:
        if not line.startswith((" ", "\t")) or not line.strip():
            break
        out.append(" ".join(line.split()))
    return out


def test_the_pages_layers_are_the_contracts():
    page, contract = page_layers(PAGE.read_text()), contract_layers((REPO / "setup.cfg").read_text())
    assert len(contract) >= 5 and page == contract, (f"ARCHITECTURE.md's layers and setup.cfg's differ:\n"
                                                     f"page:     {page}\ncontract: {contract}")
