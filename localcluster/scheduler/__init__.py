"""The scheduler: a pure state machine, no I/O, no threads, no clock. Events in, actions out.

- ``state.py``: ``Scheduler``, the one writer of ``Task.state`` (``Transitions.apply``,
  checked against ``records.TRANSITIONS``), and the events it takes.
- ``records.py``: ``Task``, ``WorkerState``, ``Spec``, the actions (Send, Resolve, Retire,
  Deliver, FailAll) and the table of allowed transitions.
- ``placement.py``, ``transfers.py``, ``forgetting.py``: its parts (where a run goes, data
  moved between workers, what is let go of), each with narrow methods.
- ``invariants.py``: ``validate()``, run after every event in the tests.
"""
