"""The same problems through ``scripts/evaluate.py`` and through lm-evaluation-harness with the model ``gkv``
(``gkv_train.evaluation.lm_eval_model``): pass@1 of each and seconds per request, under one compression; one JSON line.

The problems are a built-in task's test split (``--task``), written as a local lm-eval task (a JSONL and a YAML
under ``--output-root``): each document holds the prompt evaluate.py builds (the prompt template in the model's
chat template), generation is greedy with the same length and batch, and lm-eval grades with this project's
checker (``process_results`` calls ``gkv_rewards``: the same extraction, verification and required copy), so the
two should agree problem by problem.

    python scripts/bench_lm_eval.py                                   # SmolLM2, arithmetic, gkv budget 64
    python scripts/bench_lm_eval.py --model tiny --problems 4 --max-new-tokens 8   # quick
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gkv_train.argument_types import count, output_folder
from gkv_train.evidence.regime import COMMAND
from gkv_train.jsonio import print_json
from gkv_train.models import load_config_and_tokenizer, load_model
from gkv_train.problems.data import DataConfig, load_problems
from gkv_train.provenance import git_commit

UTILS = '''"""lm-eval's process_results for the bench: this project's grading of a completion."""
from gkv_rewards.extract import copies_in_order, extract_answer
from gkv_rewards.verify import answers_match


def process_results(doc, results):
    text = results[0]
    answer = extract_answer(text)
    ok = answer is not None and answers_match(doc["answer"], answer) and copies_in_order(text, doc.get("required"))
    return {"acc": float(ok)}
'''


def write_task(folder: Path, rows: list[dict], max_new_tokens: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "bench_utils.py").write_text(UTILS)
    (folder / "gkv_bench.yaml").write_text(
        f"task: gkv_bench\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
        'output_type: generate_until\ndoc_to_text: "{{prompt}}"\ndoc_to_target: "{{answer}}"\n'
        f"generation_kwargs:\n  until: []\n  max_gen_toks: {max_new_tokens}\n  do_sample: false\n"
        "process_results: !function bench_utils.process_results\nmetric_list:\n  - metric: acc\n"
    )


def parse_arguments() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--task", default="arithmetic")
    parser.add_argument("--problems", type=count, default=64)
    parser.add_argument("--max-new-tokens", type=count, default=96)
    parser.add_argument("--batch", type=count, default=8)
    parser.add_argument("--method", default="gkv")
    parser.add_argument("--budget", type=count, default=64)
    parser.add_argument("--window", type=count, default=8)
    parser.add_argument("--interval", type=count, default=16)
    parser.add_argument("--output-root", type=output_folder, default=Path("outputs/lm_eval_bench"))
    return parser.parse_args()


def write_problems(args) -> None:
    """The test problems as an lm-eval task under ``<output-root>/task`` (prompts in the chat template)."""
    root = args.output_root
    data = DataConfig(name=args.task, split="test", limit=args.problems)
    problems = load_problems(data)
    _, tokenizer = load_config_and_tokenizer(args.model) if args.model != "tiny" else load_model("tiny")
    rows = []
    for p in problems:
        text = data.prompt_template.format(problem=p["problem"])
        if tokenizer.chat_template:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            )
        rows.append({"prompt": text, "answer": p["answer"], "required": p.get("required")})
    write_task(root / "task", rows, args.max_new_tokens)


def run_evaluate(args, compression: list[str]) -> tuple[dict, dict[int, bool], float]:
    """``scripts/evaluate.py`` on the problems: (its run summary, correct per problem, seconds)."""
    root = args.output_root
    start = time.perf_counter()
    subprocess.run(
        [
            *COMMAND,
            "evaluate",
            f"model={args.model}",
            f"data.name={args.task}",
            "data.split=test",
            f"data.limit={args.problems}",
            "num_generations=1",
            "temperature=0",
            f"max_completion_length={args.max_new_tokens}",
            f"batch_problems={args.batch}",
            f"methods=[{args.method}]",
            f"budgets=[{args.budget}]",
            *compression,
            f"output_dir={root / 'evaluate'}",
            "plots=false",
        ],
        check=True,
    )
    evaluate_seconds = time.perf_counter() - start
    (summary,) = json.loads((root / "evaluate" / "summary.json").read_text())["runs"]
    per_problem = {}
    for line in (root / "evaluate" / f"{args.method}-b{args.budget}" / "samples.jsonl").read_text().splitlines():
        sample = json.loads(line)
        per_problem[sample["problem_id"]] = sample["correct"]

    return summary, per_problem, evaluate_seconds


def run_lm_eval(args) -> tuple[dict, dict[int, float], float]:
    """``gkv-train lm-eval`` on the same task: (its results, accuracy per problem, seconds)."""
    root = args.output_root
    start = time.perf_counter()
    model_args = (
        f"pretrained={args.model},method={args.method},budget={args.budget},window={args.window},"
        f"interval={args.interval},max_gen_toks={args.max_new_tokens}"
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "gkv_train.cli",
            "lm-eval",
            "--model",
            "gkv",
            "--model_args",
            model_args,
            "--tasks",
            "gkv_bench",
            "--include_path",
            str(root / "task"),
            "--output_path",
            str(root / "lm_eval"),
            "--batch_size",
            str(args.batch),
            "--log_samples",
        ],
        check=True,
        cwd=root,
        env={**os.environ, "HF_DATASETS_OFFLINE": "1"},
    )
    lm_eval_seconds = time.perf_counter() - start
    results = json.loads(sorted((root / "lm_eval").rglob("results_*.json"))[-1].read_text())
    theirs = {
        int(s["doc_id"]): s["acc"]
        for f in (root / "lm_eval").rglob("samples_gkv_bench_*.jsonl")
        for s in map(json.loads, f.read_text().splitlines())
    }
    return results, theirs, lm_eval_seconds


def main() -> None:
    args = parse_arguments()
    write_problems(args)
    compression = [
        f"compression.budget={args.budget}",
        f"compression.window={args.window}",
        f"compression.interval={args.interval}",
    ]

    ours, per_problem, evaluate_seconds = run_evaluate(args, compression)
    results, theirs, lm_eval_seconds = run_lm_eval(args)
    agree = sum(bool(theirs.get(i)) == bool(per_problem.get(i)) for i in range(args.problems))
    print_json(
        {
            "benchmark": "lm_eval",
            "model": args.model,
            "task": args.task,
            "problems": args.problems,
            "compression": f"{args.method} budget {args.budget} window {args.window} interval {args.interval}",
            "max_new_tokens": args.max_new_tokens,
            "batch": args.batch,
            "commit": git_commit(),
            "evaluate_pass@1": ours["pass@1"],
            "lm_eval_acc": results["results"]["gkv_bench"]["acc,none"],
            "problems_graded_alike": agree,
            "evaluate_seconds_per_request": evaluate_seconds / args.problems,
            "lm_eval_seconds_per_request": lm_eval_seconds / args.problems,
        }
    )


if __name__ == "__main__":
    main()
