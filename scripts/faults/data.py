"""Data cases: problem files and the built-in tasks."""

from __future__ import annotations

import json
from pathlib import Path

from faults.harness import (
    Case,
    Context,
    FILE_DATA,
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
            seen = [s["gold"] for s in sorted(samples, key=lambda s: (s["problem_id"], s["sample"]))
                    if s["sample"] == 0]  # fmt: skip
            if seen != golds:
                return f"golds {seen}, not {golds}"
        return None

    return check


def data_cases() -> list[Case]:
    L, C, N = "listed", "control", "new"
    K = "data"
    F = FILE_DATA
    at2 = r"data\.jsonl:2\b"
    good = q()
    cases = [
        refuse("data/empty-question", K, L, "a record with an empty question is accepted", "evaluate",
               {**F}, [at2, "question|empty"], setup=data_file([good, q("")])),
        refuse("data/blank-question", K, N, "a record whose question is only spaces", "evaluate", {**F},
               [at2, "question|empty|blank"], setup=data_file([good, q("   \n ")])),
        refuse("data/empty-question-train", K, L, "an empty question under train.py", "train", {**F},
               [at2, "question|empty"], setup=data_file([good, q("")])),
        refuse("data/empty-question-traces", K, L, "an empty question under generate_traces.py", "traces", {**F},
               [at2, "question|empty"], setup=data_file([good, q("")])),
        refuse("data/gold-nan", K, L, "a JSON NaN gold answer (read as the text 'nan')", "evaluate", {**F},
               [at2, "answer|gold"], setup=data_file([good, q(answer=float("nan"))])),
        refuse("data/gold-list", K, L, "a list gold answer [2] (read as the text '[2]')", "evaluate", {**F},
               [at2, "answer|gold"], setup=data_file([good, q(answer=[2])])),
        refuse("data/gold-None-text", K, N, "a gold answer 'None' (a missing value written as text)", "evaluate", {**F},
               [at2, "answer|gold"], setup=data_file([good, q(answer="None")])),
        refuse("data/gold-empty", K, N, "an empty gold answer ''", "evaluate", {**F}, [at2, "answer|gold"],
               setup=data_file([good, q(answer="")])),
        refuse("data/gold-bool", K, N, "a boolean gold answer", "evaluate", {**F}, [at2, "answer|gold"],
               setup=data_file([good, q(answer=True)])),
        refuse("data/gold-dict", K, N, "an object gold answer", "evaluate", {**F}, [at2, "answer|gold"],
               setup=data_file([good, q(answer={"value": 5})])),
        refuse("data/gold-nan-train", K, L, "a NaN gold answer under train.py", "train", {**F}, [at2, "answer|gold"],
               setup=data_file([good, q(answer=float("nan"))])),
        refuse("data/gold-null", K, C, "a null gold answer (checked)", "evaluate", {**F}, [at2, "answer"],
               setup=data_file([good, q(answer=None)])),
        refuse("data/not-json", K, C, "a line that is not JSON", "evaluate", {**F}, [at2, "JSON"],
               setup=data_file([good, '{"question": "x", "answer": '])),
        refuse("data/not-an-object", K, C, "a line holding a JSON array", "evaluate", {**F}, [at2, "object"],
               setup=data_file([good, "[1, 2]"])),
        refuse("data/missing-field", K, C, "no question field", "evaluate", {**F}, ["question"],
               setup=data_file([{"prompt": "x", "answer": "1"}])),
        refuse("data/missing-field-later", K, C, "a later record lacks the answer", "evaluate", {**F},
               [at2, "answer"], setup=data_file([good, {"question": "x"}])),
        refuse("data/empty-file", K, C, "an empty file", "evaluate", {**F}, ["data.jsonl", "no records|empty"],
               setup=data_file([])),
        refuse("data/blank-lines", K, C, "a file of blank lines", "evaluate", {**F}, ["data.jsonl", "no records|empty"],
               setup=data_file(["", "   ", ""])),
        refuse("data/directory-named-jsonl", K, L, "a directory named *.jsonl reported as 'does not exist'",
               "evaluate", {**F}, ["data.jsonl", "director|folder"],
               setup=lambda ctx: (ctx.work / "data.jsonl").mkdir()),
        refuse("data/missing-file", K, C, "a file that does not exist", "evaluate", {**F},
               ["data.jsonl", "not exist|no such|not found"]),
        refuse("data/unsupported-suffix", K, C, "a .txt file", "evaluate", {**F, "data.path": "{work}/data.txt"},
               ["data.txt"], setup=data_file([good], "data.txt")),
        refuse("data/bad-utf8", K, C, "bytes that are not UTF-8", "evaluate", {**F}, ["data.jsonl"],
               setup=lambda ctx: (ctx.work / "data.jsonl").write_bytes(b'{"question": "\xff\xfe", "answer": "1"}\n')),
        refuse("data/limit-minus-one-file", K, L, "data.limit=-1 on a file drops the last record", "evaluate",
               {**F, "data.limit": -1}, ["limit"], setup=data_file([q(answer="1"), q(answer="2"), q(answer="3")])),
        refuse("data/limit-zero-file", K, L, "data.limit=0 on a file: no problems, a crash in the plot", "evaluate",
               {**F, "data.limit": 0, "plots": True}, ["limit"], setup=data_file([good, good])),
        refuse("data/builtin-limit-minus-one", K, L, "data.limit=-1 on the built-in task loops forever", "traces",
               {"data.limit": -1}, ["limit"], timeout=60),
        refuse("data/builtin-level0-3000", K, L, "data.levels=[0] data.limit=3000: more problems than level 0 holds "
               "(loops forever)", "traces", {"data.levels": [0], "data.limit": 3000},
               [r"level|limit|distinct|problems"], timeout=60),
        refuse("data/builtin-test-too-many", K, C, "data.split=test data.limit=2000 (more than the test pool)",
               "traces", {"data.split": "test", "data.limit": 2000}, ["2000|limit|test"]),
        refuse("data/builtin-levels-empty", K, C, "data.levels=[]", "traces", {"data.levels": []}, ["level"]),
        refuse("data/builtin-distractors-negative", K, C, "data.distractors=-1", "traces", {"data.distractors": -1},
               ["distractors"]),
        refuse("data/path-and-name", K, C, "both data.path and data.name", "evaluate",
               {"data.path": "{work}/data.jsonl"}, [r"data\.path|data\.name"], setup=data_file([good])),
        refuse("data/preset-wrong-split", K, C, "data.name=gsm8k data.split=train (the file holds test)", "evaluate",
               {"data.name": "gsm8k", "data.split": "train"}, ["split"]),
        refuse("data/config-on-file", K, C, "data.config=main with a local file", "evaluate",
               {**F, "data.config": "main"}, ["config"], setup=data_file([good])),
        refuse("data/question-field-missing", K, C, "data.question_field=nosuch", "evaluate",
               {**F, "data.question_field": "nosuch"}, ["nosuch"], setup=data_file([good])),
        refuse("data/prompt-10MB-train", K, L, "a 10 MB prompt under train.py (far beyond the context)", "train",
               {**F}, [r"prompt|context|long|length|token"], before_load=False, timeout=240,
               setup=data_file([q("9 " * 5_000_000)])),
        refuse("data/prompt-beyond-context", K, L, "a prompt longer than the model's context (tiny: 4096 positions; "
               "SmolLM2's 20k-word prompt took > 400 s)", "evaluate", {**F},
               [r"prompt|context|long|length|token"], before_load=False, timeout=240,
               setup=data_file([q("1 + " * 1500 + "1 = ?")])),
        result("data/prompt-within-context", K, C, "a 3000-character prompt (within the context)", "evaluate", {**F},
               problems_check(1), setup=data_file([q("1 + " * 700 + "1 = ?")])),
        result("data/limit-above-size", K, C, "data.limit=5 on a 3-record file", "evaluate", {**F, "data.limit": 5},
               problems_check(3, ["1", "2", "3"]), setup=data_file([q(answer="1"), q(answer="2"), q(answer="3")])),
        result("data/limit-null", K, C, "data.limit=null reads every record", "evaluate", {**F, "data.limit": None},
               problems_check(3), setup=data_file([good, good, good])),
        result("data/question-fields-joined", K, C, "data.question_field=[a,b]", "evaluate",
               {**F, "data.question_field": ["a", "b"]}, problems_check(1),
               setup=data_file([{"a": "Tom has 2.", "b": "How many?", "answer": "2"}])),
        result("data/json-array-file", K, C, "a .json file holding an array", "evaluate",
               {**F, "data.path": "{work}/data.json"}, problems_check(2),
               setup=lambda ctx: (ctx.work / "data.json").write_text(json.dumps([good, good]))),
        result("data/gold-int-and-float", K, C, "golds 42 (int) and 27.0 (float) read as '42' and '27'", "evaluate",
               {**F}, problems_check(2, ["42", "27"]), setup=data_file([q(answer=42), q(answer=27.0)])),
        result("data/preset-gsm8k", K, C, "data.name=gsm8k (the shared test file), 2 problems", "evaluate",
               {"data.name": "gsm8k", "data.split": "test"}, problems_check(2)),
    ]
    cases.append(refuse("data/retrieval-context-1e9", "data", "round3", "data.context=1000000000 on a retrieval task: "
                        "MemoryError after 154 s (the prompt built before the context check)", "evaluate",
                        {"data.name": "niah_single", "data.context": 1000000000}, ["context"], timeout=120))
    return cases
