"""Helpers shared by the scripts: the checkout's root, one JSON line, a results file's sections (where a result came
from: ``gkv_train.provenance``; the types of their arguments: ``gkv_train.argument_types``)."""

from __future__ import annotations

import json
from pathlib import Path

from gkv_train.jsonio import dumps, write_atomically
from gkv_train.models import random_prompts  # noqa: F401
from gkv_train.problems.data import DATA_DIR, gsm8k_questions  # noqa: F401 (the scripts' imports)

ROOT = Path(__file__).resolve().parents[1]


def print_json(record: dict) -> None:
    """One strict JSON line on stdout (NaN written as null)."""
    print(dumps(record), flush=True)


def merge_section(path: Path, stage: str, section: dict, header: dict) -> None:
    """Replace ``stage``'s section of the results file ``path`` (``header``: the keys set when the file is new)."""
    old = json.loads(path.read_text()) if path.is_file() else {}
    merged = {**header, **old}
    merged[stage] = section
    write_atomically(path, dumps(merged, indent=2))
