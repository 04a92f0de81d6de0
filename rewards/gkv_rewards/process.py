"""Process hygiene: child processes that never outlive their parent (the answer-check worker, training processes
under a launcher). No heavy imports: the verifier worker imports it first."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int | None = None, signum: int = signal.SIGKILL) -> None:
    """Ask the kernel to send this process ``signum`` (SIGKILL: kill it) when its parent dies (Linux; elsewhere
    nothing happens). Training processes ask for SIGTERM, which they answer by stopping with a checkpoint.

    ``parent_pid``: the parent this process expects; when it has already died (this process was re-parented
    before the request took effect), exit at once.
    """
    if not sys.platform.startswith("linux"):
        return
    expected = os.getppid() if parent_pid is None else parent_pid
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        return
    if os.getppid() != expected:
        os._exit(1)


def started_by_launcher() -> bool:
    """Whether this process was started by a launcher (``accelerate launch``, ``torch.distributed.run``), which
    sets the rendezvous variables; a plain ``python train.py`` is left alone (``nohup`` keeps working)."""
    return "MASTER_ADDR" in os.environ or "LOCAL_RANK" in os.environ
