"""The decode-time regime's shared pieces (``gkv-train compare`` and ``scripts/bench_decode_regime.py`` run it):
its command-line arguments, the task and sampling keys of ``gkv-train evaluate`` / ``train``, one evaluation call
with the job claims passed on, and the probe's method ordering with the regime's checks (the held-out ordering:
``gkv_train.evidence.methods_stage``)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from gkv_rollout.registry import eviction_methods, registered
from gkv_train.argument_types import (
    count,
    fraction,
    natural,
    nonnegative_number,
    output_file,
    output_folder,
    positive_fraction,
    true_false,
)
from gkv_train.evidence import jobs
from gkv_train.models import check_adapter

# the jobs' command: the installed package's (``python -m gkv_train.cli train ...`` = ``accelerate launch train.py``
# with one process, ``... evaluate`` = ``scripts/evaluate.py``), so that it runs from any folder
COMMAND = [sys.executable, "-m", "gkv_train.cli"]

# The ranked methods: those that choose from the whole cache. A method that keeps each prompt by default
# (random_attention) is a control, run with --eval-controls where the task's prompt fits the budget.
EVICTION = [name for name in eviction_methods() if not registered()[name].keep_prompt]


def add_sampling_arguments(add) -> None:
    """What the regime and ``gkv-train compare`` sample with, one protocol for both (``add``: a parser's
    ``add_argument``): the compression's window and interval, temperature and top-p, problems per batch, and
    whether ``long_recall`` states its number in the prompt."""
    add("--window", type=count, default=8)
    add("--interval", type=count, default=16)
    add("--temperature", type=nonnegative_number, default=0.6)
    add("--top-p", type=positive_fraction, default=0.95)
    add("--batch-problems", type=count, default=16)
    add(
        "--number-in-prompt",
        type=true_false,
        default=True,
        metavar="{true,false}",
        help="long_recall: false asks without stating the number (only the story's first sentence holds it)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The regime's arguments: the model, the task, the sampling and compression settings, the ordering stages'
    problems, methods and budgets, the trained adapters they compare, the regime's checks."""
    add = parser.add_argument
    add("--model", default="smollm2-135m")
    add("--output-root", type=output_folder, default=Path("outputs") / "decode_regime")
    add(
        "--task",
        help="the problems' data.name (default copy_recall, unless --data-path): the regime's tasks copy_recall, "
        "long_recall (the regime at reasoning lengths, a given story) and count_recall (a given note's code after a "
        "count the model writes), or any other task or dataset gkv-train takes (arithmetic, niah_single, ...; "
        "checked before any work)",
    )
    add(
        "--data-path",
        help="a local file of problems instead (data.path; {split} in it: the split's file, train and test)",
    )
    add("--sentences", type=count, default=10, help="the task's middle sentences (copy_recall, long_recall)")
    add("--count-to", type=count, default=160, help="count_recall's last number")
    add(
        "--copy-required",
        default="last",
        choices=["last", "places"],
        help="what a completion must copy: the last sentence, or the places (the training variant)",
    )
    add(
        "--copy-share",
        type=fraction,
        default=1.0,
        help="with --copy-required places: the share of the places a completion must copy in order",
    )
    add("--problems", type=count, default=32, help="probe: train-split problems")
    add("--samples", type=count, default=2, help="probe: samples per problem")
    add("--methods", nargs="+", default=EVICTION, choices=[m for m in registered() if m != "full"])
    add(
        "--budgets",
        nargs="+",
        type=count,
        default=[160, 128],
        help="probe and methods: eviction budgets (methods: run in this order)",
    )
    add(
        "--gkv-forms",
        nargs="+",
        default=["max", "mean", "sum"],
        choices=["max", "mean", "sum"],
        help="methods: G-KV history forms (max: the gkv row)",
    )
    add(
        "--s4r-length",
        type=natural,
        default=500,
        help="methods: S4R at eta = budget / this length, its rank solved there (0: no S4R row); "
        "500: a ~200-token prompt + max-new-tokens",
    )
    add(
        "--s4r-refresh",
        type=natural,
        default=64,
        help="methods: also S4R with bases refreshed every this many generated tokens, at the same "
        "memory (the s4r-refresh row; 0: none)",
    )
    add("--results", type=output_file, help="a results file whose stage sections are replaced as they come")
    add(
        "--adapters",
        nargs="+",
        default=[],
        metavar="NAME=DIR",
        help="methods: trained LoRA adapters on the same problems (full cache, --train-method at every budget)",
    )
    add("--methods-problems", type=count, default=128, help="methods: held-out problems")
    add("--methods-samples", type=count, default=4, help="methods: samples per held-out problem")
    add("--max-new-tokens", type=count, default=300)
    add_sampling_arguments(add)
    add("--min-full", type=fraction, default=0.40)
    add("--min-gap", type=fraction, default=0.15)
    add("--min-decode-compressions", type=natural, default=6)
    add("--train-method", default="gkv", choices=[m for m in registered() if m != "full"])
    add("--seed", type=natural, default=0)


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The regime's arguments checked (``parser.error``), before any work: the other tasks without copy_recall's
    options; each adapter a NAME=DIR whose folder is an adapter trained on --model that fits it (before the
    methods' rows, which take hours)."""
    if args.data_path and args.task is not None:
        parser.error(f"--data-path replaces the task's problems: give it without --task {args.task}")
    if args.task is None and not args.data_path:
        args.task = "copy_recall"
    if args.task != "copy_recall" and (args.copy_required != "last" or args.copy_share != 1):
        parser.error(f"--task {args.task or args.data_path}: without --copy-required / --copy-share")
    problem = data_problem(args)
    if problem is not None:
        parser.error(problem)
    if any("=" not in a for a in args.adapters):
        parser.error(f"--adapters: NAME=DIR each, got {args.adapters}")
    args.adapters = [tuple(a.split("=", 1)) for a in args.adapters]
    for _, folder in args.adapters:
        try:
            check_adapter(folder, args.model)
        except (ValueError, FileNotFoundError) as err:
            parser.error(f"--adapters: {err}")


def log(message: str) -> None:
    print(f"[decode_regime {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(command: list[str], say=log) -> None:
    """Run ``command`` (said first by ``say``: ``gkv-train train ...`` for the package's command); it inherits this
    process's job claims (``gkv_train.evidence.jobs.held``): its job stays claimed while it runs, even past a
    killed worker."""
    shown = ["gkv-train", *command[len(COMMAND) :]] if command[: len(COMMAND)] == COMMAND else command[1:]
    say(" ".join(shown))
    subprocess.run(command, check=True, pass_fds=jobs.held())


SIZED = {"copy_recall": "sentences", "long_recall": "sentences", "count_recall": "count_to"}  # task -> its size key


def task_fields(split: str, limit: int, args) -> dict:
    """The ``DataConfig`` fields of the task's problems (``--task``, or ``--data-path``): their source, split, count
    and the regime's task options."""
    found = {"name": None, "path": args.data_path} if args.data_path else {"name": args.task}
    found["split"] = split
    size = None if args.data_path else SIZED.get(args.task)
    if size:
        found[size] = getattr(args, size)
    found["limit"] = limit
    if args.copy_required != "last":
        found["copy_required"] = args.copy_required
    if args.copy_share != 1:
        found["copy_share"] = args.copy_share
    if not args.number_in_prompt:
        found["number_in_prompt"] = False
    return found


def data_problem(args) -> str | None:
    """Why the task's problems cannot be read for both splits (an unknown name, a missing file, a preset that holds
    no train split), naming the argument; None when they can. One problem of each split is read."""
    from gkv_train.problems.data import DataConfig, load_problems

    what = f"--data-path {args.data_path}" if args.data_path else f"--task {args.task}"
    for split in ("train", "test"):
        try:
            load_problems(DataConfig(**task_fields(split, 1, args)), 0)
        except (ValueError, FileNotFoundError, OSError) as err:
            return f"{what}: its {split} split cannot be read ({err})"
    return None


def task_keys(group: str, split: str, limit: int, args) -> list[str]:
    """``group``'s keys (``data``, ``eval_data``) of the task's problems (``task_fields``), as overrides."""

    def value(key: str, v) -> str:
        if v is None or isinstance(v, bool):
            return {None: "null", True: "true", False: "false"}[v]
        return f"'{v}'" if key == "path" else str(v)  # quoted: {split} is Hydra's interpolation syntax otherwise

    return [f"{group}.{key}={value(key, v)}" for key, v in task_fields(split, limit, args).items()]


def sampling_keys(args) -> list[str]:
    """The sampling overrides of evaluate.py, train.py and the traces."""
    return [
        f"max_completion_length={args.max_new_tokens}",
        f"temperature={args.temperature}",
        f"top_p={args.top_p}",
    ]


def sampling_settings(args) -> list[str]:
    """The sampling settings as a results section records them (compared when a stage resumes or extends: the
    form of the first results, before the keys were grouped)."""
    return [f"max_new_tokens={args.max_new_tokens}", f"temperature={args.temperature}", f"top_p={args.top_p}"]


def evaluate(
    model: list[str],
    split: str,
    problems: int,
    samples: int,
    methods: list[str],
    budgets: list[int],
    out: Path,
    seed: int,
    args,
    full: bool = True,
    compression: list[str] | None = None,
) -> dict:
    """One ``gkv-train evaluate`` call: the full cache (``full``) and ``methods`` x ``budgets``; each run's
    summary by its name (``full``, ``gkv-b64``). ``compression``: its ``compression.*`` keys (default: the
    bench's window and interval)."""
    if compression is None:
        compression = [f"compression.window={args.window}", f"compression.interval={args.interval}"]
    run(
        [
            *COMMAND,
            "evaluate",
            *model,
            *task_keys("data", split, problems, args),
            f"num_generations={samples}",
            *sampling_keys(args),
            f"batch_problems={args.batch_problems}",
            f"methods=[{','.join((['full'] if full else []) + methods)}]",
            f"budgets=[{','.join(map(str, budgets))}]",
            *compression,
            f"output_dir={out}",
            "plots=false",
            f"seed={seed}",
        ]
    )
    return {r["run"]: r for r in json.loads((out / "summary.json").read_text())["runs"]}


def row(summary: dict, full: dict | None) -> dict:
    """One table cell: pass@1 and its interval, length, retention, memory share, compression rounds; with the
    full cache's summary, the gap to it and the decode-time rounds."""
    keep = (
        "pass@1",
        "pass@1_ci95",
        "mean_completion_length",
        "retention",
        "batch_compressions",
        "verifier_errors",
        "retention_by_position",
        "retained_density",
    )
    result = {k: summary[k] for k in keep if k in summary}
    result["memory_share"] = summary.get("memory_share", summary["retention"])
    if full is not None:
        result["gap"] = full["pass@1"] - summary["pass@1"]
        rounds = summary["batch_compressions"]  # the first round is the prefill's; s4r selects at every step: none
        result["decode_compressions"] = rounds - 1 if rounds else None
    return result


def ordering(stage: str, split: str, problems: int, samples: int, root: Path, args) -> dict:
    """The method table of the untrained model on ``split`` (stage ``probe``), with the regime's checks.
    seed + 1: other train-split samples than the ones a training run at ``--seed`` draws first."""
    runs = evaluate(
        [f"model={args.model}"], split, problems, samples, args.methods, args.budgets, root / stage, args.seed + 1, args
    )
    full = row(runs["full"], None)
    methods = {m: {str(b): row(runs[f"{m}-b{b}"], runs["full"]) for b in args.budgets} for m in args.methods}
    rows = [r for by_budget in methods.values() for r in by_budget.values()]
    checks = {
        "full_pass@1_at_least": [args.min_full, full["pass@1"] >= args.min_full],
        "decode_compressions_at_least": [
            args.min_decode_compressions,
            min(r["decode_compressions"] for r in rows) >= args.min_decode_compressions,
        ],
        "some_gap_at_least": [args.min_gap, max(r["gap"] for r in rows) >= args.min_gap],
    }
    return {
        "task": {"split": split, "problems": problems, "samples_per_problem": samples},
        "budgets": args.budgets,
        "table": {"full": full, "methods": methods},
        "checks": checks,
    }
