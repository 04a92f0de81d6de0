"""The decode-time regime: many compressions while a long completion is written, on the built-in task
``copy_recall`` (the number the answer needs is written ~120 tokens before it is needed); one JSON line.

Stage ``methods`` (resumable: each run is an ``scripts/evaluate.py`` folder, which resumes batch by batch): the
untrained model on problems of the task's *train* split (never the held-out ones), the full cache and every
eviction method at every budget, same prompts, samples and seed: pass@1 with a 95% interval, the gap to the full
cache, mean completion length, retention and compression rounds per batch (the prefill's included: what follows
it are the decode-time compressions). The JSON line, ``summary.json`` and ``summary.md`` (the table) hold them,
and the three checks the regime needs: full-cache pass@1 >= ``--min-full``, at least ``--min-decode-compressions``
rounds after the prefill's, and a gap >= ``--min-gap`` for some method.

    python scripts/bench_decode_regime.py            # SmolLM2-135M (about 25 minutes on one free CPU core)
    python scripts/bench_decode_regime.py --quick    # a tiny random model, 2 problems (a test runs it)

The training stage (RL-Sparse, RL-Full, Sparse-RL's dense learner, distillation on this task) is not here yet.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from _common import ROOT, print_json

from gkv_train.jsonio import dumps, write_atomically
from gkv_train.rollout.methods import METHODS

EVICTION = [m for m in METHODS if m not in ("full", "s4r")]


def log(message: str) -> None:
    print(f"[decode_regime {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def stage_methods(args, root: Path) -> dict:
    """One ``scripts/evaluate.py`` call: full cache and ``args.methods`` x ``args.budgets``; each run's summary by
    its name (``full``, ``gkv-b64``)."""
    out = root / "methods"
    command = [
        sys.executable, str(ROOT / "scripts" / "evaluate.py"), f"model={args.model}", "data.name=copy_recall",
        "data.split=train", f"data.sentences={args.sentences}", f"data.limit={args.problems}",
        f"num_generations={args.samples}", f"max_new_tokens={args.max_new_tokens}", f"temperature={args.temperature}",
        f"top_p={args.top_p}", f"batch_problems={args.batch_problems}", f"methods=[full,{','.join(args.methods)}]",
        f"budgets=[{','.join(map(str, args.budgets))}]", f"compression.window={args.window}",
        f"compression.interval={args.interval}", f"output_dir={out}", "plots=false", f"seed={args.seed + 1}",
    ]  # fmt: skip  (seed + 1: other train-split samples than a training run at --seed draws first)
    log(" ".join(command[1:]))
    subprocess.run(command, check=True, cwd=ROOT)
    return {run["run"]: run for run in json.loads((out / "summary.json").read_text())["runs"]}


def row(summary: dict, full: dict | None) -> dict:
    keep = ("pass@1", "pass@1_ci95", "mean_completion_length", "retention", "batch_compressions", "verifier_errors")
    result = {k: summary[k] for k in keep}
    if full is not None:
        result["gap"] = full["pass@1"] - summary["pass@1"]
        result["decode_compressions"] = summary["batch_compressions"] - 1  # the first round is the prefill's
    return result


def markdown_table(table: dict, budgets: list[int]) -> str:
    """pass@1 [95% interval] per method (rows) and budget (columns); the full cache's on its own row."""
    lines = ["| method | " + " | ".join(f"budget {b}" for b in budgets) + " |", "|---|" + "---|" * len(budgets)]

    def cell(r: dict) -> str:
        lo, hi = r["pass@1_ci95"]
        return f"{r['pass@1']:.3f} [{lo:.2f}, {hi:.2f}]"

    full = table["full"]
    lines.append(f"| full | {cell(full)} (every budget) |" + " |" * (len(budgets) - 1))
    for method, by_budget in table["methods"].items():
        lines.append(f"| {method} | " + " | ".join(cell(by_budget[str(b)]) for b in budgets) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--output-root", type=Path, default=ROOT / "outputs" / "decode_regime")
    parser.add_argument("--quick", action="store_true", help="tiny model, 2 problems, 2 methods (a test runs it)")
    parser.add_argument("--sentences", type=int, default=10, help="copy_recall's middle sentences")
    parser.add_argument("--problems", type=int, default=32, help="train-split problems")
    parser.add_argument("--samples", type=int, default=2, help="samples per problem")
    parser.add_argument("--methods", nargs="+", default=EVICTION, choices=[m for m in METHODS if m != "full"])
    parser.add_argument("--budgets", nargs="+", type=int, default=[96, 160])
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--interval", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=300)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--batch-problems", type=int, default=16)
    parser.add_argument("--min-full", type=float, default=0.40)
    parser.add_argument("--min-gap", type=float, default=0.15)
    parser.add_argument("--min-decode-compressions", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.model, args.problems, args.samples, args.methods, args.budgets = "tiny", 2, 1, ["gkv", "random"], [24]
        args.max_new_tokens, args.batch_problems, args.sentences, args.interval = 24, 2, 2, 8
    root = args.output_root
    root.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    summary = stage_methods(args, root)
    full = row(summary["full"], None)
    methods = {m: {str(b): row(summary[f"{m}-b{b}"], summary["full"]) for b in args.budgets} for m in args.methods}
    table = {"full": full, "methods": methods}
    rows = [r for by_budget in methods.values() for r in by_budget.values()]
    checks = {
        "full_pass@1_at_least": [args.min_full, full["pass@1"] >= args.min_full],
        "decode_compressions_at_least": [
            args.min_decode_compressions, min(r["decode_compressions"] for r in rows) >= args.min_decode_compressions
        ],
        "some_gap_at_least": [args.min_gap, max(r["gap"] for r in rows) >= args.min_gap],
    }
    result = {
        "benchmark": "decode_regime", "stage": "methods", "model": args.model, "quick": args.quick,
        "task": {"name": "copy_recall", "split": "train", "sentences": args.sentences, "problems": args.problems,
                 "samples_per_problem": args.samples},
        "compression": {"window": args.window, "interval": args.interval, "budgets": args.budgets},
        "sampling": {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p,
                     "seed": args.seed + 1},
        "table": table, "checks": checks, "seconds": round(time.perf_counter() - start, 1),
    }  # fmt: skip
    write_atomically(root / "summary.json", dumps(result, indent=2))
    write_atomically(root / "summary.md", markdown_table(table, args.budgets))
    print_json(result)


if __name__ == "__main__":
    main()
