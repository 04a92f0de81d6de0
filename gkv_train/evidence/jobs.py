"""Jobs that several processes share, under one folder: a claim per job and a done marker per finished one.

A claim is an exclusive ``flock`` on ``<root>/claims/<job>``, held for as long as its process works on the job: the
system lets it go when the process ends, however it ends (SIGKILL included), so a killed worker's job is free at
once, with no process ids to check (a process id can be reused). The commands a job starts inherit the claim
(``held``: their ``pass_fds``), so a job whose worker was killed while its command runs on stays claimed until that
command ends too. A released claim's file is removed; a claim taken
on a file that was removed or replaced between opening and locking is not a claim, and the new file is tried (the
usual lock-file race). A done marker, ``<root>/done/<job>`` (written whole: the time it finished), makes the job
done for every process from then on: a resumed pipeline skips it.

Job keys are ``kind/name`` strings; ``/`` becomes ``__`` in the file names.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from gkv_train.jsonio import write_atomically

_HELD: dict[Path, int] = {}  # claim file -> the descriptor that holds its lock, in this process


def _file(root: Path, folder: str, key: str) -> Path:
    return Path(root) / folder / key.replace("/", "__")


def claim(root: Path, key: str) -> bool:
    """Take job ``key`` for this process: True when taken (until ``release`` or the process ends), False when a
    live process holds it. Taking a job this process holds already is an error."""
    path = _file(root, "claims", key)
    if path in _HELD:
        raise RuntimeError(f"job {key} is claimed by this process already")
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        try:
            try:
                current = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())  # for a person reading the folder; the lock is the claim
                _HELD[path] = fd
                return True
        except BaseException:
            os.close(fd)  # the lock goes with it
            raise
        os.close(fd)  # released and removed (or replaced) before our lock: try the file there now


def release(root: Path, key: str) -> None:
    """Let go of job ``key`` (claimed by this process): its claim file removed, then the lock."""
    path = _file(root, "claims", key)
    fd = _HELD.pop(path, None)
    if fd is None:
        raise RuntimeError(f"job {key} is not claimed by this process")
    try:
        path.unlink(missing_ok=True)
    finally:
        os.close(fd)


def held() -> tuple[int, ...]:
    """The descriptors of this process's claims: a command a job starts inherits them (``pass_fds``), so that the
    job stays claimed while that command runs, even when the process that claimed it is killed first."""
    return tuple(_HELD.values())


def done_marker(root: Path, key: str) -> Path:
    return _file(root, "done", key)


def is_done(root: Path, key: str) -> bool:
    return done_marker(root, key).is_file()


def mark_done(root: Path, key: str) -> None:
    """Record job ``key`` as finished (the marker written through a rename: whole or not at all)."""
    path = done_marker(root, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, time.strftime("%Y-%m-%d %H:%M:%S"))
