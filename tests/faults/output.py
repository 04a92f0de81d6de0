"""Output cases: what every entry point writes (strict JSON, pass@k, figures, traces), and the harness's own."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Callable

from faults.configuration import mismatch_problem
from faults.harness import (
    Case,
    Context,
    Proc,
    Verdict,
    either,
    judge_refusal,
    judge_result,
    last_json_line,
    lm_eval_command,
    read_jsonl,
    result,
    samples_problem,
    strict_file,
    training_steps,
    write_jsonl,
)
from faults.state import steps_problem


def strict_outputs(out_rel: str, names: list[str], more: Callable[[Context, Proc], str | None] | None = None):
    """A check: every file ``names`` (relative to ``out_rel``, globs allowed) parses strictly, the last stdout line
    is strict JSON, and ``more`` finds nothing."""

    def check(ctx: Context, proc: Proc) -> str | None:
        base = Path(ctx.path(out_rel))
        for pattern in names:
            paths = sorted(base.glob(pattern))
            if not paths:
                return f"no {pattern}"
            for path in paths:
                problem = strict_file(path)
                if problem:
                    return problem
        if last_json_line(proc.out) is None:
            return "the last stdout line is not strict JSON"
        return more(ctx, proc) if more else None

    return check


def pass_at_k_problem(ctx: Context, proc: Proc, n: int, problems: int) -> str | None:
    """Samples and summaries agree: c <= n per problem, pass@k rising in k and equal to the unbiased estimate of
    the samples, counts, lm-eval layout's n-samples."""
    folder = ctx.work / "out" / "full"
    problem = samples_problem(ctx, n, problems)
    if problem:
        return problem
    summary = json.loads((folder / "summary.json").read_text())
    by_problem: dict = {}
    for s in read_jsonl(folder / "samples.jsonl"):
        by_problem.setdefault(s["problem_id"], []).append(bool(s["correct"]))
    for k in range(1, n + 1):
        want = sum(
            1.0 if n - sum(c) < k else 1 - math.comb(n - sum(c), k) / math.comb(n, k) for c in by_problem.values()
        ) / len(by_problem)
        if abs((summary.get(f"pass@{k}") or 0) - want) > 1e-9:
            return f"pass@{k} {summary.get(f'pass@{k}')} but the samples give {want}"
        if k > 1 and summary[f"pass@{k}"] < summary[f"pass@{k - 1}"] - 1e-12:
            return f"pass@{k} < pass@{k - 1}"
    if any(len(c) > n for c in by_problem.values()):
        return "a problem has more than n samples"
    if summary.get("verifier_checks") != problems * n:
        return f"verifier_checks {summary.get('verifier_checks')}, not {problems * n}"
    results = json.loads((ctx.work / "out" / "results.json").read_text())
    counts = [v.get("original") for v in results.get("n-samples", {}).values()]
    if counts != [problems]:
        return f"results.json n-samples {counts}, not [{problems}]"
    return None


def s4r_rank_check(ctx: Context, proc: Proc) -> str | None:
    """The rank recorded for an s4r run is one the tiny model can have (its key width, 2 KV heads x 16 = 32)."""
    found = []
    for path in [*(ctx.work / "out").glob("s4r*/summary.json"), *(ctx.work / "out").glob("s4r*/run.json")]:
        if path.is_file():
            found += re.findall(r'"rank": (\d+)', path.read_text())
    if not found:
        return "no rank recorded"
    too_big = [int(r) for r in found if int(r) > 32]
    return f"recorded rank {too_big[0]} but ran at most 32 (the model's key width)" if too_big else None


def train_outputs(ctx: Context, proc: Proc) -> str | None:
    problem = steps_problem(ctx.work / "out", 2)
    if problem:
        return problem
    evaluation = json.loads((ctx.work / "out" / "eval.json").read_text())
    if evaluation.get("problems") != 2 or not 0 <= evaluation.get("accuracy", -1) <= 1:
        return f"eval.json {evaluation}"
    return None


def traces_outputs(ctx: Context, proc: Proc) -> str | None:
    rows = read_jsonl(ctx.work / "traces.jsonl")
    line = last_json_line(proc.out) or {}
    fields = {"id", "prompt", "completion", "completion_ids", "answer", "correct"}  # later: check_timed_out, ...
    if any(not fields <= set(r) for r in rows):
        return "a trace lacks fields"
    if line.get("written") != len(rows) or line.get("samples") != 3 * 2 or len(rows) != 6:
        return f"printed {line}, file has {len(rows)} rows (keep_incorrect: 6)"
    if line.get("correct") != sum(r["correct"] for r in rows):
        return "correct count differs from the file"
    return None


def figures_problem(ctx: Context) -> str | None:
    missing = [n for n in ("pass_at_1_vs_budget.png", "retained_density.png") if not (ctx.work / "out" / n).is_file()]
    return f"no {', '.join(missing)}" if missing else None


def sweep_problem(ctx: Context, proc: Proc) -> str | None:
    runs = {p.parent.name for p in (ctx.work / "out").glob("*/summary.json")}
    want = {"full", "gkv-b16", "gkv-b32", "snapkv-b16", "snapkv-b32"}
    if runs != want:
        return f"runs {sorted(runs)}, not {sorted(want)}"
    line = last_json_line(proc.out) or {}
    return None if len(line.get("runs", [])) == 5 else f"the JSON line lists {len(line.get('runs', []))} runs, not 5"


def tiny_traces(ctx: Context) -> None:
    """A traces file for the tiny model (its character tokenizer: id = code point - 29; 2 = end of sequence)."""
    prompt = "What is 2 + 3?\nPut your final answer in \\boxed{}."
    completion = "\\boxed{5}"
    ids = [ord(c) - 29 for c in completion] + [2]
    rows = [
        {"id": i, "prompt": prompt, "completion": completion, "completion_ids": ids, "answer": "5", "correct": True}
        for i in range(4)
    ]
    write_jsonl(ctx.work / "traces.jsonl", rows)


def distill_problem(ctx: Context, proc: Proc) -> str | None:
    out = ctx.work / "out"
    for name in ("metrics.jsonl", "eval.json"):
        problem = strict_file(out / name)
        if problem:
            return problem
    steps = training_steps(out)
    return None if sorted(steps) == [1, 2] else f"steps {steps}"


def harness_cases() -> list[Case]:
    def imports_repo(ctx: Context) -> Verdict:
        code = "import gkv_train, gkv_rewards.verify as v; print(gkv_train.__file__); print(v.__file__)"
        proc = ctx.run([ctx.python, "-c", code], 60)

        def check():
            files = proc.out.split()
            outside = [f for f in files if not Path(f).resolve().is_relative_to(ctx.repo.resolve())]
            return f"imported from {outside}, not {ctx.repo}" if outside or len(files) != 2 else None

        return judge_result(proc, check)

    return [
        Case(
            "harness/imports-repo",
            "harness",
            "control",
            "the children import gkv_train from --repo (prints gkv_train.__file__)",
            imports_repo,
            60,
        )
    ]


CATEGORY = "output"
LISTED, CONTROL = "listed", "control"  # the kinds of case (bench_faults.KINDS)
EVAL_FILES = [
    "summary.json",
    "results.json",
    "full/summary.json",
    "full/run.json",
    "full/samples.jsonl",
    "full/density.jsonl",
]

# (name, kind, about, entry, changes, check, options): a case whose right outcome is exit 0 and ``check`` passing
# (``result``)
RESULTS = [
    (
        "output/evaluate-strict-json",
        CONTROL,
        "every evaluate.py JSON file and line parses strictly (3 problems x 3 samples, uneven batches)",
        "evaluate",
        {"data.limit": 3, "num_generations": 3, "batch_problems": 2},
        strict_outputs("{work}/out", EVAL_FILES, lambda ctx, proc: pass_at_k_problem(ctx, proc, 3, 3)),
        {},
    ),
    (
        "output/evaluate-one-problem",
        CONTROL,
        "one problem, one sample: undefined intervals written as null",
        "evaluate",
        {"data.limit": 1},
        strict_outputs("{work}/out", EVAL_FILES, lambda ctx, proc: pass_at_k_problem(ctx, proc, 1, 1)),
        {},
    ),
    (
        "output/evaluate-with-plots",
        CONTROL,
        "plots on: both figures written",
        "evaluate",
        {"plots": True},
        strict_outputs("{work}/out", EVAL_FILES, lambda ctx, proc: figures_problem(ctx)),
        {},
    ),
    (
        "output/evaluate-sweep",
        CONTROL,
        "methods=[full,gkv,snapkv] budgets=[16,32]: one run per pair",
        "evaluate",
        {"methods": ["full", "gkv", "snapkv"], "budgets": [16, 32], "compression.window": 4, "compression.interval": 4},
        strict_outputs("{work}/out", ["*/summary.json", "summary.json"], lambda ctx, proc: sweep_problem(ctx, proc)),
        {},
    ),
    (
        "output/train-strict-json",
        CONTROL,
        "train.py: metrics.jsonl and eval.json strict, each step once",
        "train",
        {"max_steps": 2},
        strict_outputs("{work}/out", ["metrics.jsonl", "eval.json"], train_outputs),
        {},
    ),
    (
        "output/train-rl-full",
        CONTROL,
        "recipe=rl_full: metrics and evaluation strict",
        "train",
        {"recipe": "rl_full", "max_steps": 2},
        strict_outputs("{work}/out", ["metrics.jsonl", "eval.json"], train_outputs),
        {},
    ),
    (
        "output/train-s4r-record",
        CONTROL,
        "compression.method=s4r in rl_sparse: trained under the record (mismatch < 1e-3)",
        "train",
        {"compression.method": "s4r", "max_steps": 2},
        lambda ctx, proc: mismatch_problem(ctx),
        {},
    ),
    (
        "output/traces-strict-json",
        CONTROL,
        "generate_traces.py: each line strict, counts agree",
        "traces",
        {"data.limit": 3, "num_generations": 2},
        strict_outputs("{work}", ["traces.jsonl"], traces_outputs),
        {},
    ),
    (
        "output/distill-offline",
        CONTROL,
        "recipe=distill from a traces file: strict outputs, each step once",
        "train",
        {"recipe": "distill", "max_steps": 2, "distill.traces": "{work}/traces.jsonl", "num_generations": ...},
        lambda ctx, proc: distill_problem(ctx, proc),
        {"setup": tiny_traces},
    ),
]


def lm_eval_stats(ctx: Context) -> Verdict:
    proc = ctx.run(
        lm_eval_command(
            ctx, "pretrained=tiny,method=gkv,budget=16,window=4,interval=8,stats={work}/missing/stats.jsonl"
        ),
        180,
    )
    return judge_refusal(proc, ["missing"], before_load=True, must_not_exist=[ctx.work / "out"])


def output_cases() -> list[Case]:
    results = [
        result(name, CATEGORY, kind, about, entry, changes, check, **options)
        for name, kind, about, entry, changes, check, options in RESULTS
    ]
    rank = either(
        "output/s4r-rank-recorded",
        CATEGORY,
        LISTED,
        "compression.s4r.rank=1000 for s4r: clamped to the model's width but recorded as given",
        "evaluate",
        {"compression.method": "s4r", "compression.rank": 1000},
        ["rank"],
        s4r_rank_check,
        before_load=False,
    )
    lm_eval = Case(
        "output/lm-eval-stats-missing-folder",
        "output",
        "round3",
        "gkv-train lm-eval with stats= in a folder that does not exist: a traceback after all the evaluation work",
        lm_eval_stats,
        180,
    )
    return [rank, *results, lm_eval]
