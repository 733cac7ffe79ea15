"""The documentation site (docs/, mkdocs.yml) and the README: every code block of every page runs,
and the site builds with warnings as errors and opens in a real browser.

- Each ```python block is a whole program: it runs in a fresh interpreter, in a folder of its
  own, and a ```text block right after it is what it prints (compared as tests/integration/test_readme.py
  compares, "…" eliding). A block whose output tests/integration/test_readme.py or test_dask_diagnosis.py
  check against their own runs (a death, an error) is left to them.
- Each ```bash block is made of commands CI runs: the README's quick start, or lines of .ci/run.
- The site is built by ``mkdocs build --strict``, served on 127.0.0.1, and each page opened in
  Chromium: no console error, no request that fails or leaves the machine, every image drawn,
  every link to a page or an anchor of the site found there.
"""
from __future__ import annotations

import functools
import http.server
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlparse

import pytest

from _util import browser as system_browser
from test_readme import KNOWN, README, REPO, matches

SITE_PAGES = sorted((REPO / "docs").glob("*.md"))
PAGES = [REPO / "README.md", *SITE_PAGES]
# the architecture page's diagram and its list of layers: names, not an output
# (tests/unit/test_architecture.py checks each, and compares the layers with setup.cfg's)
DIAGRAMS = ("user thread", "public paths")
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```\s*$", flags=re.S | re.M)


def expanded(page: Path) -> str:
    """The page as the site shows it: its snippets (``--8<-- "FILE"``, ``"FILE:section"``) filled in."""
    def fill(m: re.Match) -> str:
        name, _, section = m.group(1).partition(":")
        text = (REPO / name).read_text()
        if section:
            text = text.split(f"[start:{section}] -->", 1)[1].split(f"<!-- --8<-- [end:{section}]", 1)[0]
        return text
    return re.sub(r'^--8<-- "([^"]+)"\s*$', fill, page.read_text(), flags=re.M)


def blocks(page: Path) -> list:
    return [(lang, code) for lang, code in FENCE.findall(expanded(page))]


def _known(text: str) -> bool:
    return any(marker in text for marker in KNOWN + DIAGRAMS)


def _ci_commands() -> set:
    readme_quick_start = re.search(r"^```bash\n(.*?)^```", README, flags=re.S | re.M).group(1).splitlines()
    ci = [line.strip().replace(" --quiet", "") for line in (REPO / ".ci" / "run").read_text().splitlines()]
    return {line.strip() for line in readme_quick_start + ci if line.strip()}


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_block_is_of_a_kind_a_test_runs(page):
    found = blocks(page)
    allowed = _ci_commands()
    for i, (lang, code) in enumerate(found):
        after_python = i > 0 and found[i - 1][0] == "python"
        if lang == "python":
            continue
        elif lang == "text":
            assert after_python or _known(code), f"{page.name}: a text block no test compares:\n{code}"
        elif lang == "bash":
            for line in code.strip().splitlines():
                assert line.strip() in allowed, f"{page.name}: a command CI does not run: {line!r}"
        else:
            raise AssertionError(f"{page.name}: a block of kind {lang!r}: give it one a test runs:\n{code}")


def _run(code: str, folder: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               XDG_CACHE_HOME=str(folder / "cache"))      # the run registry: the test's, not the user's
    env.pop("LOCALCLUSTER_FORWARD_LOGS", None)
    script = folder / "block.py"
    script.write_text(code)
    return subprocess.run([sys.executable, script.name], capture_output=True, text=True, timeout=240,
                          cwd=folder, env=env)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_python_block_runs_and_prints_what_the_page_shows(page, tmp_path):
    found = blocks(page)
    for i, (lang, code) in enumerate(found):
        if lang != "python":
            continue
        shown = found[i + 1][1] if i + 1 < len(found) and found[i + 1][0] == "text" else None
        if shown is not None and _known(shown):
            continue            # its own test runs it (tests/integration/test_readme.py)
        folder = tmp_path / f"block{i}"
        folder.mkdir()
        proc = _run(code, folder)
        assert proc.returncode == 0, f"{page.name}, block {i}:\n{code}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        if shown is not None:
            assert matches(shown, proc.stdout), f"{page.name}, block {i} printed:\n{proc.stdout}\nthe page shows:\n{shown}"


# --- the site ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=300,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def served(site):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, name="docs-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_every_page_of_the_docs_folder_is_in_the_site_nav():
    nav = (REPO / "mkdocs.yml").read_text()
    for page in SITE_PAGES:
        assert f" {page.name}\n" in nav, f"mkdocs.yml's nav leaves out {page.name}"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_page_of_the_site_opens_in_a_browser_with_no_missing_link_or_image(site, served):
    executable = system_browser()
    sync_api = pytest.importorskip("playwright.sync_api")
    pages = sorted(p.relative_to(site).as_posix() for p in site.glob("*.html") if p.name != "404.html")
    assert {Path(p).stem for p in pages} >= {p.stem for p in SITE_PAGES}
    problems: list = []
    links: dict = {}        # (page, anchor) -> the page that links there
    ids: dict = {}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.on("console", lambda m: problems.append(f"{page.url}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda exc: problems.append(f"{page.url}: {exc}"))
            page.on("requestfailed", lambda r: problems.append(f"{page.url}: failed {r.url} ({r.failure})"))
            page.on("response", lambda r: problems.append(f"{page.url}: {r.status} {r.url}") if r.status >= 400 else None)
            page.on("request", lambda r: problems.append(f"left the machine: {r.url}")
                    if not r.url.startswith(served) and not r.url.startswith("data:") else None)
            for name in pages:
                # every request answered before the next page (one left running is aborted by the move)
                page.goto(served + name, wait_until="networkidle")
                broken = page.eval_on_selector_all(
                    "img", "imgs => imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)")
                problems += [f"{name}: image not drawn: {src}" for src in broken]
                ids[name] = set(page.eval_on_selector_all("[id]", "els => els.map(e => e.id)"))
                for href in page.eval_on_selector_all("a[href]", "as => as.map(a => a.href)"):
                    target, anchor = urldefrag(urljoin(served + name, href))
                    if target.startswith(served):
                        links.setdefault((urlparse(target).path.lstrip("/") or "index.html", anchor), name)
        finally:
            browser.close()
    for (target, anchor), source in links.items():
        if not (site / target).exists():
            problems.append(f"{source}: a link to {target}, which the site has not")
        elif anchor and target.endswith(".html") and target in ids and anchor not in ids[target]:
            problems.append(f"{source}: a link to {target}#{anchor}, which that page has not")
    assert problems == [], "\n".join(problems)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_example_in_the_api_reference_runs():
    """The docstrings' examples (``>>>``), which the API reference shows, are what they print."""
    import doctest

    import localcluster
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    seen = set()
    for name in localcluster.__all__:
        obj = getattr(localcluster, name)
        for test in finder.find(obj, f"localcluster.{name}", globs={}):
            if test.examples and test.name not in seen:
                seen.add(test.name)
                runner.run(test)
    assert "localcluster.LocalCluster" in seen and "localcluster.Client.submit" in seen, seen
    assert runner.failures == 0, f"{runner.failures} of {runner.tries} examples failed (their output is above)"


def test_the_readme_is_a_front_door_and_links_into_the_docs():
    """A new user reads the README first: short, and every page it names exists."""
    assert len(README.encode()) <= 10 * 1024, f"README.md is {len(README.encode())} bytes: move the detail to docs/"
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README):
        assert (REPO / target).exists(), f"README.md links to {target}, which is not in the checkout"


# --- the classes users hold: the names the API page lists, nothing else -----------------------

def api_members() -> dict:
    """{class name: the members docs/api.md lists for it} for the classes users hold."""
    page = (REPO / "docs" / "api.md").read_text()
    found = re.findall(r"^::: localcluster\.(\w+)\n    options:\n      members: \[([^\]]*)\]", page, flags=re.M)
    return {name: {m.strip() for m in members.split(",") if m.strip()} for name, members in found}


def _public(obj) -> set:
    return {n for n in dir(obj) if not n.startswith("_")}


def _held_in_a_task() -> tuple:
    """In a task: the public names of its client (``get_client()``) and of a future it holds,
    ended, so that it has every attribute one has."""
    from localcluster import get_client
    client = get_client()
    fut = client.submit(abs, -1)
    fut.result()
    return _public(client), _public(fut)


@pytest.mark.timeout(60)
def test_the_classes_users_hold_carry_the_names_the_api_page_lists_and_no_other():
    """Also in a task: ``get_client()`` there is the user's Client, and its futures the user's
    Futures, so they carry no more names than those (and no internal protocol)."""
    from localcluster import Client, LocalCluster
    listed = api_members()
    assert set(listed) >= {"LocalCluster", "Client", "Future"}, "docs/api.md lists no members for them"
    with LocalCluster(n_workers=1, threads_per_worker=1, forward_logs=False) as cluster, Client(cluster) as client:
        fut = client.scatter(1)         # a Future with every attribute an instance has
        task_client, task_future = client.submit(_held_in_a_task, pure=False).result()
        assert {"submit", "gather", "key", "result"} <= task_client | task_future    # the names were read
        held = (("LocalCluster", _public(cluster)), ("Client", _public(client)), ("Future", _public(fut)),
                ("Client", task_client), ("Future", task_future))
        for name, public in held:
            extra = public - listed[name]
            assert not extra, (f"{name} has public names docs/api.md does not list: {sorted(extra)}. The "
                               f"classes users hold carry dask's and concurrent.futures' names and the "
                               f"documented extras only: put internal protocol on an internal object "
                               f"(future.FutureTable, gateway.Gateway; in a task worker/client.TaskChannel), or document the name there")
            if public is not task_client and public is not task_future:    # a task has a part of the API
                missing = listed[name] - public
                assert not missing, f"docs/api.md lists {name}.{sorted(missing)}, which it does not have"


def test_the_check_of_the_listed_names_catches_a_new_public_method(monkeypatch):
    from localcluster import Future
    monkeypatch.setattr(Future, "track", lambda self: None, raising=False)
    assert "track" in _public(Future) - api_members()["Future"]
