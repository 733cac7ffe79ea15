"""What the operating system tells and allows.

- ``machine.py``: memory, CPUs, RSS, the cluster's directory, signal masks.
- ``cgroup.py``: memory cgroups (a kernel ceiling per worker, and the shared allowance).
- ``oom.py``: the evidence that the kernel's OOM killer did it (kmsg, cgroup counters).
"""
