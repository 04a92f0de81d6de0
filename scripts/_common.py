"""Helpers shared by the scripts: data paths and prompts."""

from __future__ import annotations

from pathlib import Path

from gkv_train.data import DATA_DIR, gsm8k_questions  # noqa: F401 (the scripts' imports)
from gkv_train.jsonio import dumps
from gkv_train.models import random_prompts  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]



def print_json(record: dict) -> None:
    """One strict JSON line on stdout (NaN written as null)."""
    print(dumps(record), flush=True)
