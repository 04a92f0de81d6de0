"""Where a result comes from: the command as typed, the date, the commit and the machine, recorded beside every
figure the benchmarks and ``gkv-train compare`` publish, and the line the docs print under a generated table."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path


def git_commit() -> str | None:
    """The commit of the checkout this code runs from (None outside one, as for an installed wheel)."""
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True, text=True
    )
    return done.stdout.strip() if done.returncode == 0 else None


def machine() -> str:
    """The machine in words: cores, architecture, precision, torch threads."""
    threads = os.environ.get("OMP_NUM_THREADS", "default")
    threshold = os.environ.get("MALLOC_MMAP_THRESHOLD_")  # glibc: a fixed threshold changes the peak resident memory
    heap = f", glibc mmap threshold {threshold} B" if threshold else ""
    return f"{os.cpu_count()}-core CPU ({platform.machine()}), fp32, torch threads {threads}{heap}"


def origin() -> dict:
    """Where a result comes from: the command as typed in the repository's root (a script: ``python
    scripts/NAME.py ...``; an installed command: ``gkv-train compare ...``), today's date, the commit, the machine
    (the keys ``provenance`` reads back)."""
    program = Path(sys.argv[0]).name
    head = ["python", f"scripts/{program}"] if program.endswith(".py") else [program]
    command = shlex.join([*head, *sys.argv[1:]])
    return {"command": command, "date": time.strftime("%Y-%m-%d"), "commit": git_commit(), "machine": machine()}


def provenance(section: dict) -> str:
    """The line under a generated table: the command, date, commit and machine a results section came from."""
    return (
        f"`{section.get('command', '?')}` — {section.get('date', '?')}, commit {section.get('commit', '?')}, "
        f"{section.get('machine', '?')}"
    )
