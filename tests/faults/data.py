"""Data cases: problem files and the built-in tasks."""

from __future__ import annotations

import json
from pathlib import Path

from faults.harness import (
    FILE_DATA,
    Case,
    Context,
    Proc,
    eval_problems,
    read_jsonl,
    refuse,
    result,
    write_jsonl,
)


def data_file(records: list, name: str = "data.jsonl"):
    """A setup writing ``records`` (``write_jsonl``) to ``{work}/<name>``."""
    return lambda ctx: write_jsonl(ctx.work / name, records)


def q(question="What is 2 + 3?", answer="5", **extra) -> dict:
    return {"question": question, "answer": answer, **extra}


def problems_check(expected: int, golds: list[str] | None = None):
    """An evaluate.py check: ``expected`` problems evaluated (and their golds, in order, when given)."""

    def check(ctx: Context, proc: Proc) -> str | None:
        found = eval_problems(ctx)
        if found != expected:
            return f"{found} problems evaluated, not {expected}"
        if golds is not None:
            samples = read_jsonl(Path(ctx.path("{work}/out")) / "full" / "samples.jsonl")
            seen = [
                s["gold"] for s in sorted(samples, key=lambda s: (s["problem_id"], s["sample"])) if s["sample"] == 0
            ]
            if seen != golds:
                return f"golds {seen}, not {golds}"
        return None

    return check


CATEGORY = "data"
LISTED, CONTROL, NEW = "listed", "control", "new"  # the kinds of case (bench_faults.KINDS)
AT_LINE_2 = "data\\.jsonl:2\\b"  # a message naming the file's second line
GOOD = q()  # a well-formed problem

# (name, kind, about, entry, changes, patterns, options): a case whose right outcome is a clear refusal naming every
# pattern (``refuse``; ``options``: its keywords, ``setup`` writing the data the case reads)
REFUSALS = [
    (
        "data/empty-question",
        LISTED,
        "a record with an empty question is accepted",
        "evaluate",
        {**FILE_DATA},
        [AT_LINE_2, "question|empty"],
        {"setup": data_file([GOOD, q("")])},
    ),
    (
        "data/blank-question",
        NEW,
        "a record whose question is only spaces",
        "evaluate",
        {**FILE_DATA},
        [AT_LINE_2, "question|empty|blank"],
        {"setup": data_file([GOOD, q("   \n ")])},
    ),
    (
        "data/empty-question-train",
        LISTED,
        "an empty question under train.py",
        "train",
        {**FILE_DATA},
        [AT_LINE_2, "question|empty"],
        {"setup": data_file([GOOD, q("")])},
    ),
    (
        "data/empty-question-traces",
        LISTED,
        "an empty question under generate_traces.py",
        "traces",
        {**FILE_DATA},
        [AT_LINE_2, "question|empty"],
        {"setup": data_file([GOOD, q("")])},
    ),
    (
        "data/gold-nan",
        LISTED,
        "a JSON NaN gold answer (read as the text 'nan')",
        "evaluate",
        {**FILE_DATA},
        [AT_LINE_2, "answer|gold"],
        {"setup": data_file([GOOD, q(answer=float("nan"))])},
    ),
    (
        "data/gold-list",
        LISTED,
        "a list gold answer [2] (read as the text '[2]')",
        "evaluate",
        {**FILE_DATA},
        [AT_LINE_2, "answer|gold"],
        {"setup": data_file([GOOD, q(answer=[2])])},
    ),
    (
        "data/gold-None-text",
        NEW,
        "a gold answer 'None' (a missing value written as text)",
        "evaluate",
        {**FILE_DATA},
        [AT_LINE_2, "answer|gold"],
        {"setup": data_file([GOOD, q(answer="None")])},
    ),
    (
        "data/gold-empty",
        NEW,
        "an empty gold answer ''",
        "evaluate",
        {**FILE_DATA},
        [AT_LINE_2, "answer|gold"],
        {"setup": data_file([GOOD, q(answer="")])},
    ),
    (
        "data/gold-bool",
        NEW,
        "a boolean gold answer",
        "evaluate",
        {**FILE_DATA},
        [AT_LINE_2, "answer|gold"],
        {"setup": data_file([GOOD, q(answer=True)])},
    ),
    (
        "data/gold-dict",
        NEW,
        "an object gold answer",
        "evaluate",
        {**FILE_DATA},
        [AT_LINE_2, "answer|gold"],
        {"setup": data_file([GOOD, q(answer={"value": 5})])},
    ),
    (
        "data/gold-nan-train",
        LISTED,
        "a NaN gold answer under train.py",
        "train",
        {**FILE_DATA},
        [AT_LINE_2, "answer|gold"],
        {"setup": data_file([GOOD, q(answer=float("nan"))])},
    ),
    (
        "data/gold-null",
        CONTROL,
        "a null gold answer (checked)",
        "evaluate",
        {**FILE_DATA},
        [AT_LINE_2, "answer"],
        {"setup": data_file([GOOD, q(answer=None)])},
    ),
    (
        "data/not-json",
        CONTROL,
        "a line that is not JSON",
        "evaluate",
        {**FILE_DATA},
        [AT_LINE_2, "JSON"],
        {"setup": data_file([GOOD, '{"question": "x", "answer": '])},
    ),
    (
        "data/not-an-object",
        CONTROL,
        "a line holding a JSON array",
        "evaluate",
        {**FILE_DATA},
        [AT_LINE_2, "object"],
        {"setup": data_file([GOOD, "[1, 2]"])},
    ),
    (
        "data/missing-field",
        CONTROL,
        "no question field",
        "evaluate",
        {**FILE_DATA},
        ["question"],
        {"setup": data_file([{"prompt": "x", "answer": "1"}])},
    ),
    (
        "data/missing-field-later",
        CONTROL,
        "a later record lacks the answer",
        "evaluate",
        {**FILE_DATA},
        [AT_LINE_2, "answer"],
        {"setup": data_file([GOOD, {"question": "x"}])},
    ),
    (
        "data/empty-file",
        CONTROL,
        "an empty file",
        "evaluate",
        {**FILE_DATA},
        ["data.jsonl", "no records|empty"],
        {"setup": data_file([])},
    ),
    (
        "data/blank-lines",
        CONTROL,
        "a file of blank lines",
        "evaluate",
        {**FILE_DATA},
        ["data.jsonl", "no records|empty"],
        {"setup": data_file(["", "   ", ""])},
    ),
    (
        "data/directory-named-jsonl",
        LISTED,
        "a directory named *.jsonl reported as 'does not exist'",
        "evaluate",
        {**FILE_DATA},
        ["data.jsonl", "director|folder"],
        {"setup": lambda ctx: (ctx.work / "data.jsonl").mkdir()},
    ),
    (
        "data/missing-file",
        CONTROL,
        "a file that does not exist",
        "evaluate",
        {**FILE_DATA},
        ["data.jsonl", "not exist|no such|not found"],
        {},
    ),
    (
        "data/unsupported-suffix",
        CONTROL,
        "a .txt file",
        "evaluate",
        {**FILE_DATA, "data.path": "{work}/data.txt"},
        ["data.txt"],
        {"setup": data_file([GOOD], "data.txt")},
    ),
    (
        "data/bad-utf8",
        CONTROL,
        "bytes that are not UTF-8",
        "evaluate",
        {**FILE_DATA},
        ["data.jsonl"],
        {"setup": lambda ctx: (ctx.work / "data.jsonl").write_bytes(b'{"question": "\xff\xfe", "answer": "1"}\n')},
    ),
    (
        "data/limit-minus-one-file",
        LISTED,
        "data.limit=-1 on a file drops the last record",
        "evaluate",
        {**FILE_DATA, "data.limit": -1},
        ["limit"],
        {"setup": data_file([q(answer="1"), q(answer="2"), q(answer="3")])},
    ),
    (
        "data/limit-zero-file",
        LISTED,
        "data.limit=0 on a file: no problems, a crash in the plot",
        "evaluate",
        {**FILE_DATA, "data.limit": 0, "plots": True},
        ["limit"],
        {"setup": data_file([GOOD, GOOD])},
    ),
    (
        "data/builtin-limit-minus-one",
        LISTED,
        "data.limit=-1 on the built-in task loops forever",
        "traces",
        {"data.limit": -1},
        ["limit"],
        {"timeout": 60},
    ),
    (
        "data/builtin-level0-3000",
        LISTED,
        "data.levels=[0] data.limit=3000: more problems than level 0 holds (loops forever)",
        "traces",
        {"data.levels": [0], "data.limit": 3000},
        ["level|limit|distinct|problems"],
        {"timeout": 60},
    ),
    (
        "data/builtin-test-too-many",
        CONTROL,
        "data.split=test data.limit=2000 (more than the test pool)",
        "traces",
        {"data.split": "test", "data.limit": 2000},
        ["2000|limit|test"],
        {},
    ),
    ("data/builtin-levels-empty", CONTROL, "data.levels=[]", "traces", {"data.levels": []}, ["level"], {}),
    (
        "data/builtin-distractors-negative",
        CONTROL,
        "data.distractors=-1",
        "traces",
        {"data.distractors": -1},
        ["distractors"],
        {},
    ),
    (
        "data/path-and-name",
        CONTROL,
        "both data.path and data.name given (data.path alone implies data.name=null)",
        "evaluate",
        {"data.path": "{work}/data.jsonl", "data.name": "arithmetic"},
        ["data\\.path|data\\.name"],
        {"setup": data_file([GOOD])},
    ),
    (
        "data/preset-wrong-split",
        CONTROL,
        "data.name=gsm8k data.split=train (the file holds test)",
        "evaluate",
        {"data.name": "gsm8k", "data.split": "train"},
        ["split"],
        {},
    ),
    (
        "data/config-on-file",
        CONTROL,
        "data.config=main with a local file",
        "evaluate",
        {**FILE_DATA, "data.config": "main"},
        ["config"],
        {"setup": data_file([GOOD])},
    ),
    (
        "data/question-field-missing",
        CONTROL,
        "data.question_field=nosuch",
        "evaluate",
        {**FILE_DATA, "data.question_field": "nosuch"},
        ["nosuch"],
        {"setup": data_file([GOOD])},
    ),
    (
        "data/prompt-10MB-train",
        LISTED,
        "a 10 MB prompt under train.py (far beyond the context)",
        "train",
        {**FILE_DATA},
        ["prompt|context|long|length|token"],
        {"before_load": False, "timeout": 240, "setup": data_file([q("9 " * 5000000)])},
    ),
    (
        "data/prompt-beyond-context",
        LISTED,
        "a prompt longer than the model's context (tiny: 4096 positions; SmolLM2's 20k-word prompt took > 400 s)",
        "evaluate",
        {**FILE_DATA},
        ["prompt|context|long|length|token"],
        {"before_load": False, "timeout": 240, "setup": data_file([q("1 + " * 1500 + "1 = ?")])},
    ),
    (
        "data/retrieval-context-1e9",
        "round3",
        "data.context=1000000000 on a retrieval task: MemoryError after 154 s (the prompt built before the context "
        "check)",
        "evaluate",
        {"data.name": "niah_single", "data.context": 1000000000},
        ["context"],
        {"timeout": 120},
    ),
]

# (name, kind, about, entry, changes, check, options): a case whose right outcome is exit 0 and ``check`` passing
# (``result``)
RESULTS = [
    (
        "data/prompt-within-context",
        CONTROL,
        "a 3000-character prompt (within the context)",
        "evaluate",
        {**FILE_DATA},
        problems_check(1),
        {"setup": data_file([q("1 + " * 700 + "1 = ?")])},
    ),
    (
        "data/limit-above-size",
        CONTROL,
        "data.limit=5 on a 3-record file",
        "evaluate",
        {**FILE_DATA, "data.limit": 5},
        problems_check(3, ["1", "2", "3"]),
        {"setup": data_file([q(answer="1"), q(answer="2"), q(answer="3")])},
    ),
    (
        "data/limit-null",
        CONTROL,
        "data.limit=null reads every record",
        "evaluate",
        {**FILE_DATA, "data.limit": None},
        problems_check(3),
        {"setup": data_file([GOOD, GOOD, GOOD])},
    ),
    (
        "data/question-fields-joined",
        CONTROL,
        "data.question_field=[a,b]",
        "evaluate",
        {**FILE_DATA, "data.question_field": ["a", "b"]},
        problems_check(1),
        {"setup": data_file([{"a": "Tom has 2.", "b": "How many?", "answer": "2"}])},
    ),
    (
        "data/json-array-file",
        CONTROL,
        "a .json file holding an array",
        "evaluate",
        {**FILE_DATA, "data.path": "{work}/data.json"},
        problems_check(2),
        {"setup": lambda ctx: (ctx.work / "data.json").write_text(json.dumps([GOOD, GOOD]))},
    ),
    (
        "data/gold-int-and-float",
        CONTROL,
        "golds 42 (int) and 27.0 (float) read as '42' and '27'",
        "evaluate",
        {**FILE_DATA},
        problems_check(2, ["42", "27"]),
        {"setup": data_file([q(answer=42), q(answer=27.0)])},
    ),
    (
        "data/preset-gsm8k",
        CONTROL,
        "data.name=gsm8k (the shared test file), 2 problems",
        "evaluate",
        {"data.name": "gsm8k", "data.split": "test"},
        problems_check(2),
        {},
    ),
]


def data_cases() -> list[Case]:
    refusals = [
        refuse(name, CATEGORY, kind, about, entry, changes, patterns, **options)
        for name, kind, about, entry, changes, patterns, options in REFUSALS
    ]
    results = [
        result(name, CATEGORY, kind, about, entry, changes, check, **options)
        for name, kind, about, entry, changes, check, options in RESULTS
    ]
    return [*refusals, *results]
