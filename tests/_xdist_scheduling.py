"""``--dist loadscope`` that ends when a test process dies.

pytest-xdist's LoadScopeScheduling (3.8) can wait forever once a test process dies, as one
does when pytest-timeout's thread method ends it after a test overran its time
(pytest-dev/pytest-xdist#1378, #1327, #1371). The suite then never reports, and CI only
learns it ran out of time, without the name of the test that overran.

A test process starts an item only once it holds the next item or the order to shut down.
The stock scheduler breaks that three ways when a process dies:
- It puts every scope the dead process ever got back on the queue, the finished ones
  too. A finished scope is sent as an empty order, which no report ever follows, so no
  later report triggers the next order.
- It sends the replacement process a single scope. A scope of one test leaves that
  process holding one item and waiting for a second that never comes.
- It puts the test that killed the process back on the queue. The test has already been
  reported failed, and it kills the replacement too.

This subclass keeps that rule for every living process:
- it drops finished scopes from the queue;
- it hands out scopes until a process holds two tests, or sends it the order to shut down;
- it marks the dead process's test done, as LoadScheduling does, so that test runs once.

tests/conftest.py installs it for ``--dist loadscope``.
"""
from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling


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
