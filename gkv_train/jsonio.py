"""JSON files that strict parsers accept (``null``, never ``NaN``), JSONL reading that survives damaged lines, atomic
writes, the one reader of a run's state files (``read_state``: JSON or YAML, every failure naming the file) and of a
benchmark's one results file (``read_results``), a benchmark's one JSON line (``print_json``) and a results file's
sections (``merge_section``)."""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import os
from pathlib import Path

log = logging.getLogger(__name__)

STATE_BYTES = 64 << 20  # a state file (a configuration, a trainer state, a manifest) larger than this is no such file


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


def print_json(record: dict) -> None:
    """One strict JSON line on stdout (NaN written as null)."""
    print(dumps(record), flush=True)


def merge_section(path: Path, stage: str, section: dict, header: dict) -> None:
    """Replace ``stage``'s section of the results file ``path`` (``header``: the keys set when the file is new)."""
    path = Path(path)
    old = json.loads(path.read_text()) if path.is_file() else {}
    merged = {**header, **old}
    merged[stage] = section
    write_atomically(path, dumps(merged, indent=2))


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


def read_state(path: Path, holds: type = dict) -> dict | list:
    """The mapping a run's state file holds (a manifest, a trainer state, a saved configuration: JSON, or YAML for
    ``.yaml`` / ``.yml``; ``holds=list``: the list of records a benchmark's kept file holds), read without trusting
    it: ValueError naming the file when it is larger than ``STATE_BYTES``, not UTF-8, not JSON / YAML, uses YAML
    aliases (each expanded in full by a reader: a few lines can stand for gigabytes) or holds something other than
    a ``holds``; OSError (naming it) when it cannot be read."""
    path = Path(path)
    size = path.stat().st_size
    try:
        if size > STATE_BYTES:
            raise ValueError(f"{size} bytes, more than a state file holds ({STATE_BYTES})")
        text = path.read_bytes().decode("utf-8")
        if path.suffix in (".yaml", ".yml"):
            import yaml

            try:
                aliases = [e.anchor for e in yaml.parse(text) if isinstance(e, yaml.AliasEvent)]
                if aliases:
                    raise ValueError(f"it uses YAML aliases (*{aliases[0]})")
                value = yaml.safe_load(text)
            except yaml.YAMLError as err:
                raise ValueError(f"not YAML: {' '.join(str(err).split())}") from None
        else:
            value = json.loads(text)
    except (ValueError, UnicodeDecodeError) as err:  # json's JSONDecodeError is a ValueError
        raise ValueError(f"{path} is damaged ({err})") from None
    if not isinstance(value, holds):
        wanted = "a mapping of keys" if holds is dict else f"a {holds.__name__}"
        raise ValueError(f"{path} is damaged (it holds a {type(value).__name__}, not {wanted})")
    return value


def read_results(path: Path, empty: dict, option: str = "--results") -> dict:
    """A benchmark's one results file at ``path``, or a copy of ``empty`` where there is none. ``empty`` says what
    the file must be: a JSON object whose every key of ``empty`` holds the same name (a text value:
    ``{"benchmark": "trace_config", "runs": []}``) or the same kind of container (its runs: a list or a mapping).
    Anything else is a ValueError naming ``option`` and the file, which a benchmark raises before any run (its
    hours are not spent to fail at its end, and another benchmark's file is never written over)."""
    path = Path(path)
    if not path.exists():
        return copy.deepcopy(empty)
    try:
        found = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{option} {path} is not a JSON file ({err}): another {option}") from None

    def holds(key, wanted) -> bool:
        return found.get(key) == wanted if isinstance(wanted, str) else isinstance(found.get(key), type(wanted))

    if not (isinstance(found, dict) and all(holds(k, v) for k, v in empty.items())):
        name = next(v for v in empty.values() if isinstance(v, str))
        what = ", ".join(
            f"{k} {v!r}" if isinstance(v, str) else f"a {type(v).__name__} of {k}" for k, v in empty.items()
        )
        raise ValueError(f"{option} {path} is not {name}'s results file (a JSON object with {what}): another {option}")
    return found
