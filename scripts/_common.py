"""Helpers shared by the scripts: data paths and prompts."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from gkv_train.data import DATA_DIR
from gkv_train.jsonio import dumps

ROOT = Path(__file__).resolve().parents[1]



def gsm8k_questions(n: int, path: Path = DATA_DIR / "gsm8k_test.jsonl") -> list[str]:
    """The first ``n`` GSM8K test questions."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the scripts read the benchmark data from ../shared/data/")
    with open(path) as f:
        return [json.loads(line)["question"] for _, line in zip(range(n), f)]


def random_prompts(lengths: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    """Token-id prompts of the given lengths for tokenizer-less test models (ids >= 3: no special tokens)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def print_json(record: dict) -> None:
    """One strict JSON line on stdout (NaN written as null)."""
    print(dumps(record), flush=True)
