"""Where outputs go: output paths checked before any work (kind, writable), and a full disk named when it happens
(the path, its file system and the space free and needed). Leaf module: no project imports."""

from __future__ import annotations

import errno
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # no space left; disk quota exceeded; file too large


class DiskFull(OSError):
    """A write failed for lack of space (errno ENOSPC); the message names the path, its file system, the free and
    needed space."""

    def __init__(self, message: str):
        super().__init__(message)
        self.errno = errno.ENOSPC


def existing_ancestor(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def filesystem(path: Path) -> str:
    """The file system ``path`` lies on, as words: "/data (ext4, /dev/sdb1)" (Linux: /proc/self/mountinfo;
    elsewhere "the file system of <path>")."""
    target = os.path.realpath(existing_ancestor(path))
    best = None
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return f"the file system of {target}"
    for line in lines:
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 2:
            continue
        mount = fields[4].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and (best is None or len(mount) >= len(best[0])):  # the last of equal mounts is the visible one
            best = (mount, tail[0], tail[1])
    return f"the file system of {target}" if best is None else f"{best[0]} ({best[1]}, {best[2]})"


def free_bytes(path: Path) -> int:
    """Bytes free to this user on the file system of ``path``."""
    return shutil.disk_usage(existing_ancestor(path)).free


def size_text(n: float) -> str:
    """A byte count as "1.5 GB" (decimal units)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def disk_full(path: Path, what: str, needed: int | None = None, code: int = errno.ENOSPC) -> DiskFull:
    """The error for a write of ``what`` to ``path`` that found no space (``code``: the write's errno): names the
    path, its file system, the space free now and, when known, about how much ``what`` needs; for a file larger
    than allowed (EFBIG), the process's file-size limit (``ulimit -f``) where one is set."""
    need = f"; {what} needs about {size_text(needed)}" if needed else ""
    if code == errno.EFBIG:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        cap = "ulimit -f: unlimited" if limit == resource.RLIM_INFINITY else f"ulimit -f: {size_text(limit)}"
        return DiskFull(
            f"File too large while writing {what} to {path}: a file there may not grow that large ({cap}; "
            f"{filesystem(path)}){need}. Raise the limit or choose another output folder"
        )
    return DiskFull(
        f"No space left on device while writing {what} to {path}: {filesystem(path)} has {size_text(free_bytes(path))} "
        f"free{need}. Free some space there or choose another output folder",
    )


@contextmanager
def naming_full_disk(path: Path, what: str, needed: int | None = None):
    """Within the block, an OSError for lack of space (ENOSPC, EDQUOT) becomes ``disk_full(path, what, needed)``."""
    try:
        yield
    except DiskFull:
        raise
    except OSError as err:
        if err.errno in FULL:
            raise disk_full(path, what, needed, err.errno) from err
        raise


def check_output_dir(path: Path, key: str) -> None:
    """``path`` can be an output folder: not a file, and it or the folder it would be created in is writable;
    ValueError naming ``key`` (the configuration key) otherwise."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{key}={path} is a file, not a folder: choose a folder for the outputs")
    _check_writable(path, key)


def check_output_file(path: Path, key: str) -> None:
    """``path`` can be written as a file: not a folder, and its folder (or the folder that folder would be created
    in) is writable; ValueError naming ``key`` otherwise."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{key}={path} is a folder, not a file: give the file to write (e.g. {path / 'traces.jsonl'})")
    _check_writable(path.parent if str(path.parent) else Path("."), key)


def _check_writable(folder: Path, key: str) -> None:
    base = existing_ancestor(folder)
    if not base.is_dir():
        raise ValueError(f"{key}={folder}: {base} is a file, so no folder can be created there")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ValueError(f"{key}={folder}: {base} is not writable by this user")
