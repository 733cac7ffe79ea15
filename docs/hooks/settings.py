"""The site's build hooks (mkdocs.yml ``hooks:``).

Why workers die: the table of causes gets its last column, what to do, from the code, in the
words each death's message uses (``KilledWorker.ADVICE``); a cause the page leaves out, or one
the code does not have, fails the build.

The configuration page's table is made here from ``localcluster.config`` itself: every key of
``DEFAULTS``, its default, its environment variable, and what it accepts (the validator's own
words, from the error it raises for a value it cannot take). A key the page does not explain,
or a section for a key the code does not have, fails the build: the page cannot drift from the
code. The benchmarks' chart is added to the site from ``benchmarks/results``, where bench.py
writes it.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- settings-table -->"
CAUSES = re.compile(r"<!-- causes-table -->\n(.*?)\n<!-- /causes-table -->", flags=re.S)
CHART = "benchmarks/results/latest.png"


class _Unacceptable:
    def __repr__(self) -> str:
        return "<x>"


def accepted(key: str) -> str:
    """What ``key`` takes, as its validator says when given something it cannot take."""
    from localcluster import config
    try:
        config._check(key, _Unacceptable())
    except ValueError as e:
        return str(e).split(": expected ", 1)[1]
    raise PluginError(f"config key {key!r} accepted any object: its validator checks nothing")


def _default(key: str, value: Any) -> str:
    return "see below" if value is None and key == "n_workers" else f"`{value!r}`"


def settings_table() -> str:
    from localcluster import config
    rows = ["| setting | default | environment variable | accepts |", "|---|---|---|---|"]
    for key, value in config.DEFAULTS.items():
        rows.append(f"| [`{key}`](#{key}) | {_default(key, value)} | `LOCALCLUSTER_{key.upper()}` | "
                    f"{accepted(key).replace('|', '&#124;')} |")
    return "\n".join(rows)


def explained(markdown: str) -> list[str]:
    """The keys the page explains, one ``### `key` `` heading each."""
    return re.findall(r"^### `([a-z_]+)`", markdown, flags=re.M)


def causes_table(table: str, where: str) -> str:
    """The page's table of causes with a last column: the advice of each cause's message."""
    from localcluster import KilledWorker
    from localcluster.death import CAUSES as KNOWN
    head, rule, *rows = table.splitlines()
    causes = [re.match(r"\| `([a-z-]+)` \|", row).group(1) for row in rows]
    if sorted(causes) != sorted(KNOWN):
        raise PluginError(f"{where}: the table of causes must name each of localcluster.death.CAUSES once: "
                          f"{sorted(causes)} against {sorted(KNOWN)}")
    out = [head + " what to do (the message's words) |", rule + "---|"]
    for cause, row in zip(causes, rows):
        advice = KilledWorker.ADVICE[cause]
        if cause == "exit":
            advice += " When a task was running: " + KilledWorker.ADVICE["exit-in-task"]
        out.append(f"{row} {advice.replace('|', '&#124;')} |")
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    markdown = CAUSES.sub(lambda m: causes_table(m.group(1), page.file.src_uri), markdown)
    if MARKER not in markdown:
        return markdown
    from localcluster import config
    keys, sections = list(config.DEFAULTS), explained(markdown)
    missing, unknown = [k for k in keys if k not in sections], [k for k in sections if k not in keys]
    if missing or unknown:
        raise PluginError(f"{page.file.src_uri}: explain every setting of localcluster/config.py once: "
                          f"missing {missing}, unknown {unknown}")
    return markdown.replace(MARKER, settings_table())


def on_files(files: Files, config: Any, **_: Any) -> Files:
    files.append(File.generated(config, "benchmarks/latest.png", abs_src_path=str(ROOT / CHART)))
    return files
