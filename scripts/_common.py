"""Helpers shared by the scripts: data paths, prompts, one JSON line, where a result came from."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from gkv_train.jsonio import dumps, write_atomically
from gkv_train.models import random_prompts  # noqa: F401
from gkv_train.problems.data import DATA_DIR, gsm8k_questions  # noqa: F401 (the scripts' imports)

ROOT = Path(__file__).resolve().parents[1]


def print_json(record: dict) -> None:
    """One strict JSON line on stdout (NaN written as null)."""
    print(dumps(record), flush=True)


def git_commit() -> str | None:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def machine() -> str:
    import os
    import platform

    threads = os.environ.get("OMP_NUM_THREADS", "default")
    threshold = os.environ.get("MALLOC_MMAP_THRESHOLD_")  # glibc: a fixed threshold changes the peak resident memory
    heap = f", glibc mmap threshold {threshold} B" if threshold else ""
    return f"{os.cpu_count()}-core CPU ({platform.machine()}), fp32, torch threads {threads}{heap}"


def origin() -> dict:
    """Where a result comes from: the command as typed in the repository's root, today's date, the commit, the
    machine (the keys ``provenance`` reads back)."""
    command = shlex.join(["python", f"scripts/{Path(sys.argv[0]).name}", *sys.argv[1:]])
    return {"command": command, "date": time.strftime("%Y-%m-%d"), "commit": git_commit(), "machine": machine()}


def provenance(section: dict) -> str:
    """The line under a generated table: the command, date, commit and machine a results section came from."""
    return (
        f"`{section.get('command', '?')}` — {section.get('date', '?')}, commit {section.get('commit', '?')}, "
        f"{section.get('machine', '?')}"
    )


def merge_section(path: Path, stage: str, section: dict, header: dict) -> None:
    """Replace ``stage``'s section of the results file ``path`` (``header``: the keys set when the file is new)."""
    old = json.loads(path.read_text()) if path.is_file() else {}
    merged = {**header, **old}
    merged[stage] = section
    write_atomically(path, dumps(merged, indent=2))
