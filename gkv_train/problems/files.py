"""Reading a local problem file: JSON Lines, one JSON array or Parquet, each record with its location (file and
line, or record number), every error naming the file and line (not UTF-8, not JSON, not an object, a field
missing, a gold that is no answer)."""

from __future__ import annotations

import json
from pathlib import Path

from gkv_rewards.extract import gold_answer


def read_records(path: Path) -> list[tuple[str, dict]]:
    """The records of a local .jsonl / .json / .parquet file, each with its location (``file:line`` or
    ``file: record N``). Read directly, never through the ``datasets`` cache (no Arrow copy under the home
    folder). ValueError naming the file and line of the first record that is not a JSON object, or an empty
    file."""
    kind = path.suffix
    if kind not in (".jsonl", ".json", ".parquet"):
        raise ValueError(f"unsupported dataset file {path}: use .jsonl, .json or .parquet")
    try:
        text = "" if kind == ".parquet" else utf8_text(path)
        if kind == ".parquet":
            records = [(f"{path}: record {i}", row) for i, row in enumerate(_parquet_rows(path), 1)]
        elif kind == ".json" and text.lstrip().startswith("["):  # one JSON array (else: JSON Lines)
            rows = _json_value(text, path, 0)
            records = [
                (f"{path}: record {i}", row) for i, row in enumerate(rows if isinstance(rows, list) else [rows], 1)
            ]
        else:
            records = [
                (f"{path}:{number}", _json_value(line, path, number))
                for number, line in enumerate(text.splitlines(), 1)
                if line.strip()
            ]
    except OSError as err:
        raise ValueError(f"cannot read dataset file {path}: {err}") from None
    if not records:
        raise ValueError(f"dataset file {path} holds no records")
    for where, row in records:
        if not isinstance(row, dict):
            raise ValueError(f"{where}: a record must be a JSON object, got {type(row).__name__}")
    return records


def utf8_text(path: Path) -> str:
    """The text of a data file; ValueError naming its line and column of the first byte that is not UTF-8."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line, column = data.count(b"\n", 0, err.start) + 1, err.start - data.rfind(b"\n", 0, err.start)
        raise ValueError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x} at column {column}): save the file as UTF-8"
        ) from None


def _json_value(text: str, path: Path, line: int):
    """``json.loads(text)``; ValueError naming the file and line (``line`` 0: lines counted within ``text``)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{line or err.lineno}: not valid JSON ({err.msg}, column {err.colno})") from None


def _parquet_rows(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except OSError:
        raise
    except Exception as err:  # pyarrow's own errors: a damaged or non-Parquet file
        raise ValueError(f"cannot read dataset file {path}: {err}") from None


def check_fields(records: list[tuple[str, dict]], fields: list[str], path: str) -> None:
    """Every record has every field, not null; ValueError naming the first record that does not."""
    first = records[0][1]
    missing = [f for f in fields if f not in first]
    if missing:
        raise ValueError(
            f"dataset {path} has no field(s) {missing}; its fields are {list(first)} "
            "(set data.question_field / data.answer_field)"
        )
    for where, row in records:
        bad = [f for f in fields if row.get(f) is None]
        if bad:
            raise ValueError(f"{where}: record has no value for field(s) {bad}")


def checked_gold(row: dict, answer_field: str, where: str) -> str:
    """``row``'s gold answer as ``gold_answer`` writes it; ValueError naming ``where`` (file and line, or dataset
    and row) and the field for a gold that is no answer (null, NaN, empty, a list...)."""
    try:
        return gold_answer(row[answer_field])
    except ValueError as err:
        raise ValueError(f"{where}: field {answer_field!r}: {err}") from None
