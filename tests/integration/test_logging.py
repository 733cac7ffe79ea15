"""A worker's Python logging records reach the parent as LogRecords under the logger
``localcluster.worker``, with their level, logger name and worker name kept."""
from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest

from localcluster import Client, LocalCluster
from _util import wait_for


class Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


def chatty(x):
    log = logging.getLogger("myapp.loader")
    log.debug("debug %d", x)
    log.info("loading %d", x)
    log.warning("slow disk for %s", x)
    try:
        {}["missing"]
    except KeyError:
        log.exception("lookup failed")
    return x


@pytest.fixture
def collected():
    handler = Collect()
    logger = logging.getLogger("localcluster.worker")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)


def test_records_arrive_with_level_logger_and_worker(collected):
    with LocalCluster(n_workers=1) as cluster, Client(cluster) as client:
        assert client.submit(chatty, 5).result(30) == 5
        wait_for(lambda: len(collected.records) >= 3)
        logs = client.get_worker_logs()["worker-0"]
    got = [(r.levelname, r.name, r.worker, r.getMessage()) for r in collected.records]
    assert got == [("INFO", "myapp.loader", "worker-0", "loading 5"),
                   ("WARNING", "myapp.loader", "worker-0", "slow disk for 5"),
                   ("ERROR", "myapp.loader", "worker-0", "lookup failed")]     # DEBUG is below the level set
    assert "KeyError: 'missing'" in collected.records[-1].exc_text
    assert collected.records[0].created <= collected.records[-1].created
    assert "WARNING myapp.loader: slow disk for 5" in logs and "KeyError: 'missing'" in logs


def test_without_handlers_warnings_are_printed_with_the_worker_name(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent("""
        import logging
        from localcluster import Client
        def task():
            logging.getLogger("x").warning("careful")
            logging.getLogger("x").info("quiet")
            return 1
        with Client(n_workers=1) as c:
            c.submit(task).result(30)
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "[worker-0] WARNING x: careful" in proc.stderr and "quiet" not in proc.stderr


def test_forward_logs_false_keeps_records_in_the_worker_log_only(collected):
    with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
        client.submit(chatty, 1).result(30)
        wait_for(lambda: any("lookup failed" in line for line in client.get_worker_logs()["worker-0"]))
    assert collected.records == []


@pytest.mark.slow
def test_silence_logs_hands_on_only_the_records_from_its_level(collected):
    """dask's keyword: records below the level stay in the worker's log, not in your logging."""
    with LocalCluster(n_workers=1, silence_logs="error") as cluster, Client(cluster) as client:
        client.submit(chatty, 2).result(30)
        wait_for(lambda: collected.records)        # the last of the task's records: those before it are handled
        logs = client.get_worker_logs()["worker-0"]
    assert [(r.levelname, r.getMessage()) for r in collected.records] == [("ERROR", "lookup failed")]
    assert "INFO myapp.loader: loading 2" in logs and "WARNING myapp.loader: slow disk for 2" in logs
