"""docs/dask-api.md names every public name of distributed.Client and distributed.Future, each
as works, differs or not on one machine; what works or differs exists on ours, and what is not
on one machine raises a NotImplementedError that says what to use instead."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import localcluster
from localcluster import Client

TABLE = Path(__file__).resolve().parents[2] / "docs" / "dask-api.md"
STATUSES = {"works", "differs", "not on one machine"}


def rows() -> dict:
    """{"Client": {name: status}, "Future": {...}} from the document's two tables."""
    found: dict = {}
    section = None
    for line in TABLE.read_text().splitlines():
        heading = re.fullmatch(r"## (Client|Future)", line)
        if heading:
            section = found.setdefault(heading.group(1), {})
        elif line.startswith("## "):
            section = None
        elif section is not None:
            row = re.match(r"\| `(\w+)` \| ([^|]+?) \|", line)
            if row:
                assert row.group(1) not in section, f"{row.group(1)} twice"
                section[row.group(1)] = row.group(2)
    return found


def public(cls) -> set:
    return {n for n in dir(cls) if not n.startswith("_")}


def test_every_row_has_a_status():
    table = rows()
    assert table["Client"] and table["Future"]
    for cls, names in table.items():
        for name, status in names.items():
            assert status in STATUSES, f"{cls}.{name}: {status!r}"


def test_the_table_names_every_public_name_of_distributed():
    distributed = pytest.importorskip("distributed")
    table = rows()
    for cls, theirs in (("Client", distributed.Client), ("Future", distributed.Future)):
        missing = public(theirs) - set(table[cls])
        assert not missing, f"docs/dask-api.md lacks {cls}.{sorted(missing)}"
        stale = set(table[cls]) - public(theirs)
        assert not stale, f"docs/dask-api.md lists {cls}.{sorted(stale)}, which distributed does not have"


def _call(obj, name):
    attr = inspect.getattr_static(type(obj), name)
    if isinstance(attr, property):
        return getattr(obj, name)
    params = [p for p in inspect.signature(getattr(obj, name)).parameters.values()
              if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return getattr(obj, name)(*[None] * len(params))


def test_what_works_is_ours_and_what_is_not_on_one_machine_says_what_to_use():
    table = rows()
    with localcluster.LocalCluster(n_workers=0, forward_logs=False) as cluster, Client(cluster) as client:
        fut = client.submit(int, pure=False)        # pending: no worker runs it
        for cls, obj in (("Client", client), ("Future", fut)):
            for name, status in table[cls].items():
                if status != "not on one machine":
                    assert hasattr(obj, name), f"{cls}.{name} is missing on ours"
                    continue
                with pytest.raises(NotImplementedError) as raised:
                    _call(obj, name)
                assert f"{cls}.{name} is dask" in str(raised.value) and "docs/dask-api.md" in str(raised.value)
