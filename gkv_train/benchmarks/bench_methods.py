"""Method ordering at tight budgets: pass@1 with 95% intervals for every compression method, one JSON line.

Every run (dataset x interval x method x budget, every other setting at the method's default: the reference
recipes) is one ``scripts/evaluate.py`` call with n samples per problem; its pass@1 with a 95% bootstrap
interval over problems (the samples of one problem are not independent), each problem's share of correct
samples, mean completion length, retention, seconds and command go into the bench's one results file
(``--results``, ``results/bench_methods.json``) under its tag (a code version: ``before``, ``after``) as
``<dataset>/<run>``, as soon as the run ends. A run the file holds (with the same settings) is not run again, so
the benchmark continues across interrupted sessions when the file is kept (committed); an interrupted
``evaluate.py`` call continues batch by batch from its folder under ``--work-root``. When every planned run is
there, the JSON line gathers every run of the tag (also those of earlier calls with other datasets), each with its
settings. One process writes a results file at a time.

    python scripts/bench_methods.py                                     # SVAMP and GSM8K, 64 problems, n 4
    python scripts/bench_methods.py --datasets svamp --limit 16 --samples 2 --max-new-tokens 64   # quick
    python scripts/bench_methods.py --evaluate /old/checkout/scripts/evaluate.py --sampling-keys n_samples --tag before
    python scripts/bench_methods.py --datasets recall-d8 --limit 128 --budgets 32 48 --intervals 32 --max-new-tokens 10

The docs' tables: ``tables(view, result)`` (``scripts/render_docs.py``), a view per dataset, every tag side by side.

A dataset is a preset name (``svamp``, ``gsm8k``, ...) or ``recall-d<N>``: the built-in task's level 0 (test
split: "Eli has 20 cards." then N distractor facts about others, then "How many cards does Eli have now?"),
prompted "Reply with only the number.", written to a JSONL file under ``--work-root`` and given to
``evaluate.py`` as ``data.path`` (so that another code version reads the same problems). Its prompts are long
and its answers a few tokens: the prompt is compressed right after prefill, and a method scores by whether it
kept the one fact asked about. It tells methods apart where SmolLM2 scores a few percent on SVAMP and GSM8K.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from gkv_train.argument_types import (
    count,
    input_file,
    nonnegative_number,
    output_file,
    output_folder,
    positive_fraction,
)
from gkv_train.jsonio import print_json, read_results, write_atomically
from gkv_train.stats import bootstrap_interval


def read_run(run_dir: Path) -> dict:
    """pass@1, its interval, each problem's share of correct samples, length and retention of one
    evaluate.py run folder."""
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
        "per_problem": per_problem,
    }


def planned_runs(args) -> list[tuple[str, int, str, int | None]]:
    """(dataset, interval, method, budget) of every run; ``full`` once per dataset (it has no interval)."""
    runs = []
    for dataset in args.datasets:
        for i, interval in enumerate(args.intervals):
            for method in args.methods:
                if method == "full":
                    if i == 0:
                        runs.append((dataset, interval, method, None))
                    continue
                runs.extend((dataset, interval, method, budget) for budget in args.budgets)
    return runs


RECALL_PROMPT = "{problem} Reply with only the number."


def sampling_overrides(args) -> list[str]:
    """evaluate.py's sampling options, named as ``--sampling-keys`` says the evaluated version names them."""
    if args.sampling_keys == "trl":
        samples, longest, prefix = "num_generations", "max_completion_length", ""
    elif args.sampling_keys == "group":
        samples, longest, prefix = "sampling.num_generations", "sampling.max_new_tokens", "sampling."
    else:
        samples, longest, prefix = args.sampling_keys, "max_new_tokens", ""
    return [
        f"{samples}={args.samples}",
        f"{longest}={args.max_new_tokens}",
        f"{prefix}temperature={args.temperature}",
        f"{prefix}top_p={args.top_p}",
    ]


def data_overrides(dataset: str, limit: int, work_root: Path) -> list[str]:
    """evaluate.py's data options for ``dataset`` (see the module's docstring)."""
    if not dataset.startswith("recall-d"):
        return [f"data.name={dataset}", f"data.limit={limit}"]
    from gkv_train.problems.tasks import arithmetic_task

    problems = arithmetic_task(limit, "test", seed=0, levels=(0,), distractors=int(dataset.removeprefix("recall-d")))
    path = work_root / f"{dataset}_{limit}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(
        path, "".join(json.dumps({"question": p["problem"], "answer": p["answer"]}) + "\n" for p in problems)
    )
    return [
        f"data.path={path}",
        "data.name=null",
        "data.question_field=question",
        "data.answer_field=answer",
        f"data.limit={limit}",
        f"data.prompt_template='{RECALL_PROMPT}'",
    ]


def run_key(method: str, budget: int | None, interval: int) -> str:
    return "full" if method == "full" else f"{method}-b{budget}-i{interval}"


def tables(view: str, result: dict) -> str:
    """``scripts/render_docs.py``'s view of the results file (``results/bench_methods.json``): ``view`` names a
    dataset (``_`` for ``-``: ``recall_d8``); a row per method, pass@1 [95% interval] per budget (and interval,
    where several were run) and tag, side by side; the full cache's in the heading."""
    dataset = view.replace("_", "-")
    tags = result["tags"]
    by_tag = {t: {r["run"]: r for r in tag["runs"].values() if r["dataset"] == dataset} for t, tag in tags.items()}
    if not any(by_tag.values()):
        raise SystemExit(
            f"error: bench_methods view {view!r}: a dataset that was run "
            f"(here: {sorted({r['dataset'] for tag in tags.values() for r in tag['runs'].values()})})"
        )
    by_tag = {t: runs for t, runs in by_tag.items() if runs}
    names = {name for runs in by_tag.values() for name in runs if name != "full"}
    settings = sorted({tuple(int(p[1:]) for p in name.split("-")[1:]) for name in names})  # (budget, interval)
    intervals = {i for _, i in settings}
    order = ["streaming", "snapkv", "h2o", "rkv", "gkv"]
    methods = sorted({name.split("-")[0] for name in names}, key=lambda m: (order.index(m) if m in order else 99, m))

    def cell(run: dict | None) -> str:
        return "-" if run is None else f"{run['pass@1']:.3f} [{run['ci95'][0]:.3f}, {run['ci95'][1]:.3f}]"

    columns = [(b, i, tag) for b, i in settings for tag in by_tag]
    full = "; ".join(f"{tag} {cell(runs.get('full'))}" for tag, runs in by_tag.items())
    lines = [
        f"| {dataset} (full cache: {full}) | "
        + " | ".join(f"budget {b}{f' interval {i}' if len(intervals) > 1 else ''} {tag}" for b, i, tag in columns)
        + " |",
        "|---|" + "---|" * len(columns),
    ]
    for method in methods:
        lines.append(
            f"| {method} | " + " | ".join(cell(by_tag[tag].get(f"{method}-b{b}-i{i}")) for b, i, tag in columns) + " |"
        )
    first = next(r for runs in by_tag.values() for r in runs.values())["settings"]
    return "\n".join(lines) + (
        f"\n\n{first['problems']} problems x {first['n']} samples, {first['model']}, temperature "
        f"{first['temperature']}, top-p {first['top_p']}, up to {first['max_new_tokens']} new "
        f"tokens; tags: {', '.join(by_tag)} (results/bench_methods.json)\n"
    )


def parse_arguments() -> argparse.Namespace:
    """The command line (the roots and evaluate.py resolved)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--datasets", nargs="+", default=["svamp", "gsm8k"])
    parser.add_argument("--limit", type=count, default=64, help="problems per dataset (the first ones)")
    parser.add_argument("--samples", type=count, default=4, help="samples per problem (n)")
    parser.add_argument("--methods", nargs="+", default=["full", "streaming", "snapkv", "h2o", "rkv", "gkv"])
    parser.add_argument("--budgets", nargs="+", type=count, default=[64, 128])
    parser.add_argument("--intervals", nargs="+", type=count, default=[32, 128])
    parser.add_argument("--max-new-tokens", type=count, default=256)
    parser.add_argument("--temperature", type=nonnegative_number, default=0.6)
    parser.add_argument("--top-p", type=positive_fraction, default=0.95)
    parser.add_argument("--batch-problems", type=count, default=16)
    parser.add_argument(
        "--results",
        type=output_file,
        default=Path("results/bench_methods.json"),
        help="the results file: every run of every tag (the bench's memory)",
    )
    parser.add_argument(
        "--work-root", type=output_folder, default=Path("outputs/bench_methods"), help="evaluate.py output"
    )
    parser.add_argument(
        "--tag", default="current", help="a name for this code version (in --results, under --work-root)"
    )
    parser.add_argument(
        "--evaluate",
        type=input_file,
        default="scripts/evaluate.py",
        help="evaluate.py to run (checked before any work)",
    )
    parser.add_argument(
        "--sampling-keys",
        choices=["trl", "group", "num_generations", "n_samples"],
        default="trl",
        help="how evaluate.py names its sampling keys: TRL's names (num_generations, max_completion_length, ...), "
        "the sampling group of 2026-12-03 to -06 (sampling.num_generations, ...), or flat keys with max_new_tokens "
        "and this sample-count key (a checkout of the flat layout)",
    )
    parser.add_argument("--plan-only", action="store_true", help="print the runs still to do and stop")
    args = parser.parse_args()
    args.results, args.work_root, args.evaluate = (
        args.results.resolve(),
        args.work_root.resolve(),
        args.evaluate.resolve(),
    )
    return args


def run_one(dataset: str, interval: int, method: str, budget: int | None, settings: dict, args) -> dict:
    """One evaluate.py run: the settings, the run's metrics, its seconds and command."""
    name = f"{dataset}_{run_key(method, budget, interval)}"
    out = args.work_root / args.tag / name
    command = [
        sys.executable,
        str(args.evaluate),
        f"model={args.model}",
        *data_overrides(dataset, args.limit, args.work_root),
        *sampling_overrides(args),
        f"batch_problems={args.batch_problems}",
        f"methods=[{method}]",
        f"budgets=[{budget or 64}]",
        f"compression.interval={interval}",
        f"output_dir={out}",
        "plots=false",
    ]
    print(f"[bench_methods] {name}: {' '.join(command[2:])}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True, cwd=args.evaluate.parents[1])
    (run_dir,) = [p for p in out.iterdir() if (p / "samples.jsonl").is_file()]
    result = {"settings": settings, "dataset": dataset, "run": run_key(method, budget, interval), **read_run(run_dir)}
    result["seconds"] = round(time.perf_counter() - start, 1)  # of this call (less when it resumed)
    result["command"] = " ".join(command[1:])
    return result


def main() -> None:
    args = parse_arguments()
    settings = {
        "model": args.model,
        "problems": args.limit,
        "n": args.samples,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
    }
    try:
        result = read_results(args.results, {"benchmark": "methods", "tags": {}})
    except ValueError as err:
        sys.exit(f"error: {err}")
    runs = result["tags"].setdefault(args.tag, {"runs": {}})["runs"]
    todo = []
    for dataset, interval, method, budget in planned_runs(args):
        key = f"{dataset}/{run_key(method, budget, interval)}"
        if key in runs:
            if runs[key]["settings"] != settings:
                sys.exit(
                    f"error: {args.results}: {args.tag} {key} was measured with other settings "
                    f"({runs[key]['settings']}); another --tag or --results to rerun"
                )
            continue
        todo.append((key, dataset, interval, method, budget))
    if args.plan_only:
        print("\n".join(f"{args.tag} {t[0]}" for t in todo))
        return

    for key, dataset, interval, method, budget in todo:
        runs[key] = run_one(dataset, interval, method, budget, settings, args)
        write_atomically(args.results, json.dumps(result, indent=1) + "\n")  # each run kept as it ends

    # every run of the tag, also those of earlier calls with other datasets or settings
    summary = {k: {f: v for f, v in run.items() if f not in ("per_problem", "command")} for k, run in runs.items()}
    print_json({"benchmark": "methods", "tag": args.tag, "runs": summary})


if __name__ == "__main__":
    main()
