"""The suite's two test processes (pytest-xdist): a test process that dies is named, shown
and replaced, and the run ends. tests/conftest.py imports the hooks below.

**A test that overran shows its stacks.** pytest-timeout's thread method ends the test
process of a test that overran its time, after writing every thread's stack to pytest's
terminal writer. Under xdist that writer reaches nothing: the run only says that the process
crashed while running the test. In a test process, faulthandler's watchdog takes the timer
over (``pytest_timeout_set_timer``). It writes the stacks to the process's own stderr,
which the run's output shows, and ends the process as pytest-timeout would. It works even
while the test holds the GIL in C.

**The run ends.** pytest-xdist's LoadScopeScheduling (3.8) can wait forever once a test
process dies (pytest-dev/pytest-xdist#1378, #1327, #1371). CI then only learns that it ran
out of time. A test process starts an item only once it holds the next item or the order to
shut down. The stock scheduler breaks that rule three ways when a process dies:
- It puts every scope the dead process ever got back on the queue, the finished ones
  too. A finished scope is sent as an empty order, which no report ever follows, so no
  later report triggers the next order.
- It sends the replacement process a single scope. A scope of one test leaves that
  process holding one item and waiting for a second that never comes.
- It puts the test that killed the process back on the queue. The test has already been
  reported failed, and it kills the replacement too.

LoadScopeThatSurvivesACrash keeps the rule for every living process:
- it drops finished scopes from the queue;
- it hands out scopes until a process holds two tests, or sends it the order to shut down;
- it marks the dead process's test done, as LoadScheduling does, so that test runs once.
"""
from __future__ import annotations

import faulthandler
import os

import pytest
from xdist.scheduler import LoadScopeScheduling

#: the hooks a conftest imports: ``from _xdist import *``
__all__ = ["pytest_configure", "pytest_unconfigure", "pytest_timeout_set_timer", "pytest_xdist_make_scheduler"]

_STDERR: list[int] = []     # a test process's own stderr, copied before any test captures it


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        _STDERR.append(os.dup(2))


def pytest_unconfigure(config):
    while _STDERR:
        os.close(_STDERR.pop())


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_timeout_set_timer(item, settings):
    """pytest-timeout's thread method, in a test process, by faulthandler's watchdog: the
    stacks reach the run's output. pytest-timeout's own cancel hook calls ``cancel_timeout``."""
    if not _STDERR or settings.method != "thread" or settings.timeout <= 0:
        return None
    faulthandler.dump_traceback_later(settings.timeout, exit=True, file=_STDERR[0])
    item.cancel_timeout = faulthandler.cancel_dump_traceback_later
    return True


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` (setup.cfg), but one that ends when a test process dies."""
    if config.getvalue("dist") != "loadscope":
        return None
    return LoadScopeThatSurvivesACrash(config, log)


class LoadScopeThatSurvivesACrash(LoadScopeScheduling):
    def remove_node(self, node):
        workload = self.assigned_work.pop(node)
        unfinished = [(scope, nodeid) for scope, unit in workload.items()
                      for nodeid, done in unit.items() if not done]
        if not unfinished:
            return None
        scope, crashitem = unfinished[0]
        workload[scope][crashitem] = True      # reported failed already; again would kill the next
        for scope, unit in workload.items():
            if not all(unit.values()):
                self.workqueue[scope] = unit
        for other in self.assigned_work:
            self._reschedule(other)
        return crashitem

    def _reschedule(self, node):
        while not node.shutting_down:
            for scope in [s for s, unit in self.workqueue.items() if all(unit.values())]:
                del self.workqueue[scope]
            if not self.workqueue:
                node.shutdown()
            elif self._pending_of(self.assigned_work[node]) > 2:
                return
            else:
                self._assign_work_unit(node)
                if self._pending_of(self.assigned_work[node]) >= 2:
                    return
