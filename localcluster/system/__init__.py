"""What the operating system tells and allows.

- ``machine.py``: memory, CPUs, RSS, the cluster's directory, signal masks, a thread's frame.
- ``cgroup.py``: memory cgroups (a kernel ceiling per worker, and the shared allowance).
- ``oom.py``: the evidence that the kernel's OOM killer did it (kmsg, cgroup counters).
- ``kernel_log.py``: what the kernel log says of a process that ended unseen.
- ``registry.py``: the per-user registry of runs, and who a process is.
- ``spin.py``: poll a little before sleeping, while the machine's CPUs are not contended.
"""
