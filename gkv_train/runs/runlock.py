"""One run per output folder (or output file) at a time: an exclusive ``flock`` on ``<folder>/.run.lock`` (for a
file: ``.<name>.lock`` beside it), held for the run's life.

The kernel drops the lock when its holder exits in any way (SIGKILL and crashes included), so a lock file left
behind by a dead process never blocks a new run. The holder writes its PID, host, start time and command into
the file, so that a refused run can name it. The file itself stays (removing it could let two runs lock two
different files of one name). Imports only ``RunLocked`` (``gkv_train.exits``), the refusal it raises.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from gkv_train.exits import RunLocked

LOCK_FILE = ".run.lock"
RETRY_S = 0.2  # a lock found held is tried once more after this long (a probe's instant, a holder writing its note)


def is_lock_file(name: str) -> bool:
    """Whether a file ``name`` is a lock file ``RunLock`` leaves (a folder's, or an output file's): no one's output."""
    return name == LOCK_FILE or (name.startswith(".") and name.endswith(".lock"))


class RunLock:
    """The lock of one folder (or output file), held from ``acquire`` until ``release`` or the end of the process."""

    def __init__(self, folder: Path, fd: int):
        self.folder, self.fd = Path(folder), fd

    @classmethod
    def acquire(cls, folder: Path, what: str = "folder") -> RunLock:
        """Lock the existing ``folder`` for this process, or raise ``RunLocked`` naming the live holder (PID, host,
        start time, command); ``what`` names the folder in that message (e.g. ``output_dir``)."""
        return cls._acquire(Path(folder) / LOCK_FILE, folder, what)

    @classmethod
    def acquire_file(cls, path: Path, what: str = "output") -> RunLock:
        """Lock the output file ``path`` (whose folder exists; the file need not) for this process, as ``acquire``
        does a folder: through ``.<name>.lock`` beside it, so other files of the folder stay free."""
        path = Path(path)
        return cls._acquire(path.with_name(f".{path.name}.lock"), path, what)

    @classmethod
    def check_free(cls, target: Path, what: str = "folder", file: bool = False) -> None:
        """Raise ``RunLocked`` (naming the live holder, as ``acquire`` would) when another process holds the lock
        of ``target`` (a folder; ``file``: an output file), changing nothing: no lock file is made or written (a
        folder that is refused stays as it was). The lock is tested by taking it shared for an instant (a run
        acquiring it in that instant tries again, ``_acquire``); one found held is tested once more after
        ``RETRY_S`` (a run that was only starting has written its note by then, or was another's probe)."""
        target = Path(target)
        lock_path = target.with_name(f".{target.name}.lock") if file else target / LOCK_FILE
        try:
            fd = os.open(lock_path, os.O_RDONLY)
        except OSError:  # no lock file: no holder
            return
        try:
            if not _lock(fd, fcntl.LOCK_SH):
                raise in_use(target, what, fd)
        finally:
            os.close(fd)

    @classmethod
    def _acquire(cls, lock_path: Path, target: Path, what: str) -> RunLock:
        """Lock ``lock_path``, the lock file of ``target`` (named ``what`` in the message of ``RunLocked``)."""
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)  # never truncated here: the holder's note stays readable
        try:
            if not _lock(fd, fcntl.LOCK_EX):
                raise in_use(target, what, fd)
        except BaseException:
            os.close(fd)
            raise
        note = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(note) + "\n").encode(), 0)
        return cls(lock_path.parent, fd)

    def release(self) -> None:
        """Give the lock up (closing the file drops it; the file stays)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _lock(fd: int, kind: int) -> bool:
    """Take the lock ``kind`` (``LOCK_SH``, ``LOCK_EX``) of the file ``fd`` without waiting, trying once more after
    ``RETRY_S`` when it is held: another job's probe (``check_free``) holds it shared for an instant, and a run that
    is starting holds it before its note is written. Whether it was taken."""
    for attempt in range(2):
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt == 0:
                time.sleep(RETRY_S)
    return False


def in_use(target: Path, what: str, fd: int) -> RunLocked:
    """The refusal of ``target`` (named ``what``), whose lock file ``fd`` another live process holds: its note."""
    holder = _describe(os.pread(fd, 1 << 16, 0))
    return RunLocked(
        f"{what} {target} is in use by another run ({holder}): wait for it to end, or choose another {what}"
    )


def _describe(text: bytes) -> str:
    """The holder's note as words: "pid 123 on host h, started 2026-12-03 10:00:00 +0000: python train.py ..."."""
    try:
        note = json.loads(text.decode())
        return f"pid {note['pid']} on host {note['host']}, started {note['started']}: {note['command']}"
    except (ValueError, KeyError, TypeError):  # the holder has not written its note yet
        return "a process that has not yet written its PID"
