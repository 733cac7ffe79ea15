"""Between the parent and its workers.

- ``protocol.py``: the messages, one small frozen dataclass per meaning.
- ``channel.py``: frames over the Unix socket pair; large buffers copied straight between
  the processes by the parent (``vmcopy.py``), or in memfds where the kernel does not allow that.
- ``serialize.py``: pickling of functions, arguments, results and errors.
- ``board.py``: each worker's status board in shared memory (seqlock), read without asking.
- ``remote.py``: a worker's traceback, with real file names, as the user's exception.
- ``basics.py``: what the worker's side and the parent's diagnosis both need (a thread's
  ident on the board, ``RemoteTraceback``), so that a worker does not import the diagnosis.
- ``vmcopy.py``, ``recycle.py``: large data copied straight between processes, into receive
  buffers kept warm.
"""
