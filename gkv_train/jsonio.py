"""JSON files that strict parsers accept (``null``, never ``NaN``), JSONL reading that survives damaged lines, and
atomic writes."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from pathlib import Path

log = logging.getLogger(__name__)


def finite(value):
    """``value`` with every non-finite float (NaN, +-inf), at any depth of dicts / lists / tuples, replaced by
    None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(value, indent: int | None = None) -> str:
    """Strict JSON text of ``value`` (non-finite floats written as null; other objects as their text)."""
    return json.dumps(finite(value), indent=indent, allow_nan=False, default=str)


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename: readers see the old or the new file,
    never a part. A write that fails (a full disk, an interruption) leaves the old file and no temporary one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def file_identity(path: Path, sample_bytes: int = 16 << 20) -> list:
    """What identifies a file's content wherever it lies: its name, size and the SHA-256 of its bytes (of the
    first and last ``sample_bytes`` when it is larger than twice that, so multi-GB weights cost two reads of
    16 MiB). Neither the folder nor the modification time counts: a copied or re-created data folder is the
    same data, and resuming an evaluation there must not be refused."""
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= 2 * sample_bytes:
            digest.update(f.read())
        else:
            digest.update(f.read(sample_bytes))
            f.seek(size - sample_bytes)
            digest.update(f.read(sample_bytes))
    return [path.name, size, digest.hexdigest()[:16]]


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of a JSONL file (none if it does not exist). A line that is not a JSON object (cut by an
    interruption, garbled) is skipped with a warning naming the file and line."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    with open(path, errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                record = err
            if isinstance(record, dict):
                records.append(record)
            else:
                log.warning("%s:%d: not a JSON object, line skipped (%s)", path, number, record)
    return records
