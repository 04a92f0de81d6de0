"""Method ordering at tight budgets: pass@1 with 95% intervals for every compression method, one JSON line.

For each dataset and interval, one ``scripts/evaluate.py`` call sweeps ``--methods`` x ``--budgets`` (every
other setting at the method's default: the reference recipes), n samples per problem; then pass@1 per run
with a 95% bootstrap interval over problems (the samples of one problem are not independent), mean completion
length and retention. Resumable: ``evaluate.py`` continues an interrupted sweep batch by batch, and a finished
sweep is read back, not rerun.

    python scripts/bench_methods.py                                     # SVAMP and GSM8K, 64 problems, n 4
    python scripts/bench_methods.py --datasets svamp --limit 16 --samples 2 --max-new-tokens 64   # quick
    python scripts/bench_methods.py --evaluate /path/to/other/checkout/scripts/evaluate.py --tag before

Writes ``<output-root>/<tag>/<dataset>_i<interval>/`` (evaluate.py's folders) and prints the JSON line (also
``<output-root>/<tag>/bench_methods.json``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from _common import ROOT, print_json

from gkv_train.evaluation import bootstrap_interval


def read_run(run_dir: Path) -> dict:
    """pass@1, its interval, length and retention of one evaluate.py run folder."""
    by_problem: dict = {}
    lengths, retention = [], []
    with open(run_dir / "samples.jsonl") as f:
        for line in f:
            s = json.loads(line)
            by_problem.setdefault(s["problem_id"], []).append(float(s["correct"]))
            lengths.append(s["length"])
            retention.append(s["retention"])
    per_problem = [sum(c) / len(c) for c in by_problem.values()]
    low, high = bootstrap_interval(per_problem)
    return {
        "pass@1": sum(per_problem) / len(per_problem),
        "ci95": [low, high],
        "problems": len(per_problem),
        "samples": len(lengths),
        "mean_length": sum(lengths) / len(lengths),
        "retention": sum(retention) / len(retention),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--datasets", nargs="+", default=["svamp", "gsm8k"])
    parser.add_argument("--limit", type=int, default=64, help="problems per dataset (the first ones)")
    parser.add_argument("--samples", type=int, default=4, help="samples per problem (n)")
    parser.add_argument("--methods", nargs="+", default=["full", "streaming", "snapkv", "h2o", "rkv", "gkv"])
    parser.add_argument("--budgets", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--intervals", nargs="+", type=int, default=[32, 128])
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--batch-problems", type=int, default=16)
    parser.add_argument("--output-root", type=Path, default=ROOT / "outputs" / "bench_methods")
    parser.add_argument("--tag", default="current", help="a name for this code version (a folder under the root)")
    parser.add_argument("--evaluate", type=Path, default=ROOT / "scripts" / "evaluate.py", help="evaluate.py to run")
    args = parser.parse_args()

    root = args.output_root / args.tag
    result = {
        "benchmark": "methods", "model": args.model, "tag": args.tag, "problems": args.limit, "n": args.samples,
        "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p,
        "budgets": args.budgets, "intervals": args.intervals, "runs": {},
    }  # fmt: skip
    start = time.perf_counter()
    for dataset in args.datasets:
        for i, interval in enumerate(args.intervals):
            methods = [m for m in args.methods if m != "full" or i == 0]  # full does not depend on the interval
            out = root / f"{dataset}_i{interval}"
            command = [
                sys.executable, str(args.evaluate), f"model={args.model}", f"data.name={dataset}",
                f"data.limit={args.limit}", f"num_generations={args.samples}", f"max_new_tokens={args.max_new_tokens}",
                f"temperature={args.temperature}", f"top_p={args.top_p}", f"batch_problems={args.batch_problems}",
                f"methods=[{','.join(methods)}]", f"budgets=[{','.join(map(str, args.budgets))}]",
                f"compression.interval={interval}", f"output_dir={out}", "plots=false",
            ]  # fmt: skip
            print(f"[bench_methods] {dataset} interval {interval}: {' '.join(command[2:])}", file=sys.stderr, flush=True)
            subprocess.run(command, check=True, cwd=args.evaluate.parents[1])
            for run_dir in sorted(p for p in out.iterdir() if (p / "samples.jsonl").is_file()):
                name = run_dir.name if run_dir.name == "full" else f"{run_dir.name}-i{interval}"
                result["runs"][f"{dataset}/{name}"] = read_run(run_dir)
    result["seconds"] = round(time.perf_counter() - start, 1)
    root.mkdir(parents=True, exist_ok=True)
    (root / "bench_methods.json").write_text(json.dumps(result, indent=2))
    print_json(result)


if __name__ == "__main__":
    main()
