"""Between the parent and its workers.

- ``protocol.py``: the messages, one small frozen dataclass per meaning.
- ``channel.py``: frames over the Unix socket pair; large buffers in memfds.
- ``serialize.py``: pickling of functions, arguments, results and errors.
- ``board.py``: each worker's status board in shared memory (seqlock), read without asking.
- ``remote.py``: a worker's traceback, with real file names, as the user's exception.
"""
