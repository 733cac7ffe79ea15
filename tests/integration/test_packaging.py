"""What a user installs is what we test: ``python -m build`` makes an sdist and, from it, a
wheel; each installs in a fresh virtual environment (its dependencies from the package
index) and runs ``examples/quickstart.py`` there, away from this checkout, so that the
installed package, not the source tree, is the one imported."""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import localcluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(localcluster.__file__).resolve().parent.parent
QUICKSTART = REPO / "examples" / "quickstart.py"


def _env() -> dict:
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(name, None)
    return env


def _run(args: list, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, env=_env(),
                          timeout=timeout)
    assert proc.returncode == 0, f"{args}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", out, REPO], cwd=out)
    return out


def _one(folder: Path, pattern: str) -> Path:
    (found,) = folder.glob(pattern)
    return found


def test_the_wheel_ships_the_license_and_the_type_marker(dist):
    names = zipfile.ZipFile(_one(dist, "localcluster-*.whl")).namelist()
    assert "localcluster/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    assert not any(n.startswith("tests/") for n in names)
    metadata = zipfile.ZipFile(_one(dist, "localcluster-*.whl")).read(
        next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: BSD-3-Clause" in metadata
    assert f"Version: {localcluster.__version__}" in metadata


def test_the_sdist_carries_what_its_readers_and_the_docs_need(dist):
    with tarfile.open(_one(dist, "localcluster-*.tar.gz")) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    for name in ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "localcluster/py.typed",
                 "examples/quickstart.py", "mkdocs.yml", "docs/index.md"):
        assert name in names, name


def test_the_wheel_and_the_sdist_install_and_run_the_quick_start_in_a_fresh_venv(dist, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    away = tmp_path / "elsewhere"           # not the checkout: its package would shadow the installed one
    away.mkdir()
    script = away / QUICKSTART.name
    script.write_text(QUICKSTART.read_text())
    for artifact, extra in ((_one(dist, "localcluster-*.whl"), []),
                            (_one(dist, "localcluster-*.tar.gz"), ["--force-reinstall", "--no-deps"])):
        _run([python, "-m", "pip", "install", "--quiet", *extra, artifact], cwd=away)
        where = _run([python, "-c", "import localcluster; print(localcluster.__file__)"], cwd=away).stdout
        assert Path(where.strip()).is_relative_to(venv), where
        proc = _run([python, script.name], cwd=away, timeout=120)
        assert "sum of squares: 285" in proc.stdout, proc.stdout
