"""Several CPU processes from ``accelerate launch --num_processes N``.

Without accelerators, ``accelerate launch --num_processes N`` uses its simple launcher, which starts a single
process unless MPI is installed. ``relaunch_cpu_processes`` notices that case (accelerate set ``MASTER_ADDR``
but no ``RANK``), reads N from the launching command and replaces the process with a ``torch.distributed.run``
of N processes; the trainer then runs them on CPU with the gloo backend.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch


def requested_cpu_processes() -> int:
    """N of the ``accelerate launch --num_processes N`` that started this single CPU process, else 1."""
    if "RANK" in os.environ or "MASTER_ADDR" not in os.environ or torch.cuda.is_available():
        return 1
    try:
        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return 1
    if "launch" not in parent:
        return 1
    from accelerate.commands.launch import launch_command_parser

    args, _ = launch_command_parser().parse_known_args(parent[parent.index("launch") + 1 :])
    return args.num_processes or 1


def relaunch_cpu_processes() -> None:
    """Re-execute this script under ``torch.distributed.run`` when more CPU processes were asked for."""
    n = requested_cpu_processes()
    if n > 1:
        port = os.environ.get("MASTER_PORT", "29500")
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", f"--master_port={port}"]
        os.execv(sys.executable, command + sys.argv)
