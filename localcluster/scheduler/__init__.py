"""The scheduler: a pure state machine, no I/O, no threads, no clock. Events in, instructions out.

- ``state.py``: ``Scheduler``, its one door ``handle(*events) -> instructions`` (the table
  ``HANDLERS``) and its queries; the one writer of ``Task.state`` (``Transitions.apply``,
  checked against ``records.TRANSITIONS``).
- ``events.py``: the events the door takes, a small frozen class per meaning.
- ``records.py``: ``Task``, ``WorkerState``, ``Spec``, the actions (Send, Resolve, Retire,
  Deliver, FailAll) and the table of allowed transitions.
- its parts, each with narrow methods: ``admission.py`` (the tasks' way in: submit,
  scatter), ``placement.py`` (where a run goes), ``readiness.py``
  (a task's way to ready or to erred), ``outcomes.py`` (the ends of runs), ``deaths.py``
  (what a worker's death does to the tasks), ``transfers.py`` (data moved between workers),
  ``forgetting.py`` (what is let go of), ``roster.py`` (what workers could run, when a closing
  one may go), ``calls.py`` (``Client.run``), ``asking.py`` (tasks that submit tasks).
- ``invariants.py``: ``validate()``, run after every event in the tests.
- ``coordination.py``: Lock, Semaphore, Event, Queue and Variable, kept by the scheduler.
"""
