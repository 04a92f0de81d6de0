"""Problem sets: local JSONL/JSON/Parquet files, hub datasets, presets for ../shared/data, and a built-in task.

Every loader returns a ``datasets.Dataset`` with the columns ``id``, ``problem`` (the question text) and
``answer`` (the gold answer as a string), whatever the source's field names.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

import datasets

from rewards.extract import gold_answer

DATA_DIR = Path(os.environ.get("GKV_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))


@dataclass(frozen=True)
class Preset:
    file: str
    question_field: tuple[str, ...]
    answer_field: str


PRESETS = {
    "aime24": Preset("aime24_test.jsonl", ("problem",), "answer"),
    "amc23": Preset("amc23_test.jsonl", ("problem",), "answer"),
    "math500": Preset("math500_test.jsonl", ("problem",), "answer"),
    "gsm8k": Preset("gsm8k_test.jsonl", ("question",), "answer"),
    "svamp": Preset("svamp_test.jsonl", ("Body", "Question"), "Answer"),
}
BUILTIN = "arithmetic"


def load_problems(
    path: str | None = None,
    name: str | None = None,
    question_field: str | list[str] = "question",
    answer_field: str = "answer",
    split: str = "train",
    limit: int | None = None,
    seed: int = 0,
    levels: tuple[int, ...] = (1, 2),
) -> datasets.Dataset:
    """Load problems from ``path`` (a local file) or ``name`` (a preset, ``arithmetic`` or a hub dataset).

    question_field: one field, or several joined with a space (SVAMP: ``[Body, Question]``).
    split: the hub split, or ``train`` / ``test`` of the built-in task.
    """
    if (path is None) == (name is None):
        raise ValueError("give exactly one of data.path (a local file) or data.name (a preset or hub dataset)")
    if name == BUILTIN:
        return arithmetic_task(limit or 256, split=split, seed=seed, levels=levels)
    if name in PRESETS:
        preset = PRESETS[name]
        path, question_field, answer_field = str(DATA_DIR / preset.file), list(preset.question_field), preset.answer_field
    if path is not None:
        if not Path(path).is_file():
            raise FileNotFoundError(f"dataset file {path} does not exist")
        kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(Path(path).suffix)
        if kind is None:
            raise ValueError(f"unsupported dataset file {path}: use .jsonl, .json or .parquet")
        raw = datasets.load_dataset(kind, data_files=path, split="train")
    else:
        raw = datasets.load_dataset(name, split=split)
    fields = [question_field] if isinstance(question_field, str) else list(question_field)
    missing = [f for f in [*fields, answer_field] if f not in raw.column_names]
    if missing:
        raise ValueError(
            f"dataset {path or name} has no field(s) {missing}; its fields are {raw.column_names} "
            "(set data.question_field / data.answer_field)"
        )
    if limit is not None:
        raw = raw.select(range(min(limit, len(raw))))
    rows = [
        {"id": i, "problem": " ".join(str(row[f]).strip() for f in fields), "answer": gold_answer(row[answer_field])}
        for i, row in enumerate(raw)
    ]
    return datasets.Dataset.from_list(rows)


TEST_POOL = 1024  # the built-in test split is (a prefix of) these many problems, all excluded from train
NAMES = ["Ava", "Ben", "Cleo", "Dan", "Eli", "Fay", "Gus", "Hana", "Ivan", "June", "Kai", "Lena", "Milo", "Nora"]
ITEMS = ["apples", "marbles", "stickers", "books", "coins", "pencils", "shells", "cards", "stamps", "cookies"]


def _problem(rng: random.Random, level: int) -> tuple[str, int]:
    """One word problem of a difficulty level and its integer answer.

    1: one addition or subtraction of two numbers up to 20; 2: one multiplication, or two additions/subtractions;
    3: a chain of three operations; 4: four or five operations, with a division that comes out even.
    """
    who, item = rng.choice(NAMES), rng.choice(ITEMS)
    total = rng.randint(2, 20)
    text = [f"{who} has {total} {item}."]
    if level == 1:
        steps = [rng.choice("+-")]
    elif level == 2:
        steps = ["*"] if rng.random() < 0.4 else [rng.choice("+-"), rng.choice("+-")]
    elif level == 3:
        steps = [rng.choice("+-*"), rng.choice("+-"), rng.choice("+-")]
    else:
        steps = [rng.choice("+-*") for _ in range(rng.randint(3, 4))] + ["/"]
    for op in steps:
        if op == "-" and total == 0:
            op = "+"  # nothing left to give away: answers stay non-negative
        if op == "+":
            n = rng.randint(1, 20)
            total += n
            text.append(f"{who} gets {n} more {item}.")
        elif op == "-":
            n = rng.randint(1, min(total, 20))
            total -= n
            text.append(f"{who} gives away {n} {item}.")
        elif op == "*":
            n = rng.randint(2, 5)
            total *= n
            text.append(f"Then the number of {item} {who} has becomes {n} times as large.")
        else:
            divisors = [d for d in range(2, 7) if total % d == 0] or [1]
            n = rng.choice(divisors)
            total //= n
            text.append(f"{who} splits the {item} into {n} equal groups and keeps one group." if n > 1 else
                        f"{who} keeps all the {item}.")
    text.append(f"How many {item} does {who} have now?")
    return " ".join(text), total


def arithmetic_task(n: int, split: str = "train", seed: int = 0, levels: tuple[int, ...] = (1, 2)) -> datasets.Dataset:
    """The built-in task: procedural arithmetic word problems with exact integer answers, deterministic in
    ``seed``. ``train`` and ``test`` come from separate random streams and never share a problem."""
    if split not in ("train", "test"):
        raise ValueError(f"the built-in task has splits train and test, not {split!r}")
    bad = [lv for lv in levels if lv not in (1, 2, 3, 4)]
    if bad or not levels:
        raise ValueError(f"built-in task levels are 1-4, got {list(levels)}")

    def stream(which: str):
        rng = random.Random(f"{seed}:{which}")
        while True:
            level = levels[rng.randrange(len(levels))]
            yield (*_problem(rng, level), level)

    if split == "test" and n > TEST_POOL:
        raise ValueError(f"the built-in test split holds {TEST_POOL} problems, {n} requested")
    held_out = set()
    if split == "train":  # exclude every problem the test split can produce
        test_stream = stream("test")
        held_out = {next(test_stream)[0] for _ in range(TEST_POOL)}
    rows, seen = [], set()
    for text, answer, level in stream(split):
        if text in held_out or text in seen:
            continue
        seen.add(text)
        rows.append({"id": len(rows), "problem": text, "answer": str(answer), "level": level})
        if len(rows) == n:
            break
    return datasets.Dataset.from_list(rows)
