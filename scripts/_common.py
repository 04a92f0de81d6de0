"""Helpers shared by the scripts: the checkout's root and the package's helpers they import (one JSON line:
``gkv_train.jsonio``; where a result came from: ``gkv_train.provenance``; the types of their arguments:
``gkv_train.argument_types``)."""

from __future__ import annotations

from pathlib import Path

from gkv_train.jsonio import print_json  # noqa: F401 (the scripts' imports)
from gkv_train.models import random_prompts  # noqa: F401
from gkv_train.problems.data import DATA_DIR, gsm8k_questions  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
