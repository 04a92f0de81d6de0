"""The decode-time regime's shared pieces (``bench_decode_regime.py`` and ``bench_rl_evidence.py`` run it): its
command-line arguments, the task and sampling keys of ``evaluate.py`` / ``train.py``, one ``evaluate.py`` call, and
the method-ordering stages (``probe``: train split; ``methods``: held-out, with the G-KV forms, S4R at equal memory
and trained adapters) with their rows and table (the intervals its benchmarks report: ``gkv_train.stats``)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from gkv_rollout.registry import eviction_methods, registered
from gkv_train.evaluation.report import plot_retained_density
from gkv_train.evidence import jobs
from gkv_train.models import check_adapter

from _common import ROOT, count, fraction, natural, nonnegative_number, output_file, output_folder, positive_fraction

# The ranked methods: those that choose from the whole cache. A method that keeps each prompt by default
# (random_attention) is a control, run with --eval-controls where the task's prompt fits the budget.
EVICTION = [name for name in eviction_methods() if not registered()[name].keep_prompt]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The regime's arguments: the model, the task, the sampling and compression settings, the ordering stages'
    problems, methods and budgets, the trained adapters they compare, the regime's checks."""
    add = parser.add_argument
    add("--model", default="smollm2-135m")
    add("--output-root", type=output_folder, default=ROOT / "outputs" / "decode_regime")
    add(
        "--task",
        default="copy_recall",
        choices=["copy_recall", "long_recall", "count_recall"],
        help="long_recall: the regime at reasoning lengths, an evaluation task (probe and methods stages); "
        "count_recall: a given note's code after a count the model writes",
    )
    add("--sentences", type=count, default=10, help="the task's middle sentences (copy_recall, long_recall)")
    add("--count-to", type=count, default=160, help="count_recall's last number")
    add(
        "--number-in-prompt",
        type=lambda v: {"true": True, "false": False}[v],
        default=True,
        metavar="{true,false}",
        help="long_recall: false asks without stating the number (only the story's first sentence holds it)",
    )
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
    add("--window", type=count, default=8)
    add("--interval", type=count, default=16)
    add("--max-new-tokens", type=count, default=300)
    add("--temperature", type=nonnegative_number, default=0.6)
    add("--top-p", type=positive_fraction, default=0.95)
    add("--batch-problems", type=count, default=16)
    add("--min-full", type=fraction, default=0.40)
    add("--min-gap", type=fraction, default=0.15)
    add("--min-decode-compressions", type=natural, default=6)
    add("--train-method", default="gkv", choices=[m for m in registered() if m != "full"])
    add("--seed", type=natural, default=0)


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The regime's arguments checked (``parser.error``), before any work: the other tasks without copy_recall's
    options; each adapter a NAME=DIR whose folder is an adapter trained on --model that fits it (before the
    methods' rows, which take hours)."""
    if args.task != "copy_recall" and (args.copy_required != "last" or args.copy_share != 1):
        parser.error(f"--task {args.task}: without --copy-required / --copy-share")
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
    """Run ``command`` from the checkout (said first by ``say``); it inherits this process's job claims
    (``gkv_train.evidence.jobs.held``): its job stays claimed while it runs, even past a killed worker."""
    say(" ".join(command[1:]))
    subprocess.run(command, check=True, cwd=ROOT, pass_fds=jobs.held())


def task_keys(group: str, split: str, limit: int, args) -> list[str]:
    variant = [f"{group}.copy_required={args.copy_required}"] if args.copy_required != "last" else []
    if args.copy_share != 1:
        variant.append(f"{group}.copy_share={args.copy_share}")
    size = f"{group}.count_to={args.count_to}" if args.task == "count_recall" else f"{group}.sentences={args.sentences}"
    if not args.number_in_prompt:
        variant.append(f"{group}.number_in_prompt=false")
    return [f"{group}.name={args.task}", f"{group}.split={split}", size, f"{group}.limit={limit}", *variant]


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
    """One ``scripts/evaluate.py`` call: the full cache (``full``) and ``methods`` x ``budgets``; each run's
    summary by its name (``full``, ``gkv-b64``). ``compression``: its ``compression.*`` keys (default: the
    bench's window and interval)."""
    if compression is None:
        compression = [f"compression.window={args.window}", f"compression.interval={args.interval}"]
    run(
        [
            sys.executable,
            str(ROOT / "scripts" / "evaluate.py"),
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


def stage_methods(root: Path, args, publish) -> dict:
    """Held-out ordering (stage ``methods``): per budget, the full cache and the eviction methods, the G-KV forms
    and S4R at the same persistent memory; ``publish(section)`` after every row. A row already in ``--results``
    from a run with the same settings is taken from there (a stage cut short continues where it stopped, on
    another machine too)."""
    folder, model, seed = root / "methods", [f"model={args.model}"], args.seed + 1
    problems, samples = args.methods_problems, args.methods_samples
    settings = methods_settings(args, seed)
    table: dict = {"full": None, "methods": {}}
    section = {
        "task": {"split": "test", "problems": problems, "samples_per_problem": samples},
        "budgets": args.budgets,
        "seed": seed,
        "s4r": {"length": args.s4r_length, "eta": {}, "refresh": args.s4r_refresh},
        "settings": settings,
        "table": table,
        "partial": True,
    }
    earlier = earlier_rows(args.results, settings)
    if args.adapters:
        section["adapters"] = {}

    def measure(name: str, budget: int | None, run) -> None:
        """The row ``name`` at ``budget`` (the full cache: None) into the table and published: an earlier one,
        else from ``run()``'s summary."""
        found = earlier.get((name, budget)) or row(run(), None if name == "full" else table["full"])
        if name == "full":
            table["full"] = found
        else:
            table["methods"].setdefault(name, {})[str(budget)] = found
        publish(section)

    def runs_of(methods: list[str], budget: int, out: Path, extra: list[str] | None = None, full: bool = False):
        return evaluate(
            model, "test", problems, samples, methods, [budget], out, seed, args, full=full, compression=extra
        )

    for budget in args.budgets:  # each row published as soon as it is done
        # the full cache and the eviction methods not measured yet: one evaluate.py call (they share their options)
        todo = [m for m in args.methods if (m, budget) not in earlier]
        plain = runs_of(todo, budget, folder, full=("full", None) not in earlier) if todo else {}
        measure("full", None, lambda: plain.get("full") or runs_of([], budget, folder, full=True)["full"])
        for method in args.methods:
            measure(method, budget, lambda m=method: plain[f"{m}-b{budget}"])
        for form in (f for f in args.gkv_forms if f != "max"):
            extra = [
                f"compression.window={args.window}",
                f"compression.interval={args.interval}",
                f"compression.options.form={form}",
            ]
            measure(
                f"gkv-{form}",
                budget,
                lambda e=extra, f=form: runs_of(["gkv"], budget, folder / f"gkv-{f}", e)[f"gkv-b{budget}"],
            )
        if args.s4r_length:
            eta = round(budget / args.s4r_length, 4)
            section["s4r"]["eta"][str(budget)] = eta
            extra = [f"compression.options.eta={eta}", f"compression.options.expected_length={args.s4r_length}"]
            measure("s4r", budget, lambda e=extra: runs_of(["s4r"], budget, folder, e)[f"s4r-b{budget}"])
            if args.s4r_refresh:  # the same memory, bases that follow the generation (docs/s4r.md)
                extra = [*extra, f"compression.options.refresh={args.s4r_refresh}"]
                measure(
                    "s4r-refresh",
                    budget,
                    lambda e=extra: runs_of(["s4r"], budget, folder / "s4r-refresh", e)[f"s4r-b{budget}"],
                )
    for name, adapter in args.adapters:  # a trained model: the full cache and the training method at every budget
        section["adapters"][name] = adapter_row(name, adapter, settings, folder, seed, args)
        publish(section)
    first = str(args.budgets[0])
    rows = {"full": table["full"], **{name: by[first] for name, by in table["methods"].items() if first in by}}
    plot_density(rows, args.budgets[0], root / "methods_density.png", args.task)
    section["density_budget"] = args.budgets[0]
    section["density"] = {name: r.get("retained_density") for name, r in rows.items()}
    section["partial"] = False
    return section


def methods_settings(args, seed: int) -> dict:
    """What a methods stage's rows depend on (rows of a results file with other settings are not reused)."""
    return {
        "model": args.model,
        **({"task": args.task} if args.task != "copy_recall" else {}),  # copy_recall: the settings' first form
        **({"count_to": args.count_to} if args.task == "count_recall" else {"sentences": args.sentences}),
        **({} if args.number_in_prompt else {"number_in_prompt": False}),
        "window": args.window,
        "interval": args.interval,
        "sampling": sampling_settings(args),
        "problems": args.methods_problems,
        "samples": args.methods_samples,
        "seed": seed,
        "s4r_length": args.s4r_length,
    }


def adapter_row(name: str, adapter: str, settings: dict, folder: Path, seed: int, args) -> dict:
    """A trained model's row of the methods stage: the full cache and the training method at every budget (an
    earlier one with the same settings, else evaluated now under ``folder``)."""
    found = earlier_adapter(args.results, settings, name, adapter, args.budgets)
    if found is not None:
        return found
    runs = evaluate(
        [f"model={args.model}", f"adapter={adapter}"],
        "test",
        args.methods_problems,
        args.methods_samples,
        [args.train_method],
        args.budgets,
        folder / f"adapter-{name}",
        seed,
        args,
    )
    return {
        "adapter": adapter,
        "full": row(runs["full"], None),
        "compressed": {str(b): row(runs[f"{args.train_method}-b{b}"], runs["full"]) for b in args.budgets},
        "method": args.train_method,
    }


def earlier_rows(results: Path | None, settings: dict) -> dict:
    """(row name, budget) -> row of the methods section in ``results`` when it was measured with ``settings``
    (the full cache's budget: None)."""
    if results is None or not results.is_file():
        return {}
    old = json.loads(results.read_text()).get("methods", {})
    if old.get("settings") != json.loads(json.dumps(settings)):
        return {}
    found = {(name, int(b)): r for name, by in old["table"]["methods"].items() for b, r in by.items()}
    if old["table"].get("full") is not None:
        found["full", None] = old["table"]["full"]
    return found


def earlier_adapter(results: Path | None, settings: dict, name: str, adapter: str, budgets: list[int]) -> dict | None:
    """The adapter row ``name`` of the methods section in ``results`` when it was measured with ``settings``, from
    the same ``adapter`` folder, at every budget of ``budgets``."""
    if results is None or not results.is_file():
        return None
    old = json.loads(results.read_text()).get("methods", {})
    if old.get("settings") != json.loads(json.dumps(settings)):
        return None
    found = old.get("adapters", {}).get(name)
    if found is None or found["adapter"] != adapter or any(str(b) not in found["compressed"] for b in budgets):
        return None
    return found


def plot_density(rows: dict, budget: int, path: Path, task: str) -> None:
    """The retained-position plot of every row at one budget (``plot_retained_density``), rows by name."""
    named = [
        {
            "run": name,
            "budget": None if name == "full" else budget,
            "compression": {"method": name.split("-")[0]},
            "retention": r["retention"],
            "retention_by_position": r["retention_by_position"],
            "retained_density": r["retained_density"],
        }
        for name, r in rows.items()
        if "retained_density" in r
    ]
    title = f"{task} (held-out), budget {budget} (s4r: the same memory), at each sequence's last decoding step"
    plot_retained_density(named, path, title)


def s4r_keys(budget: int, args) -> list[str]:
    """S4R at the persistent memory of an eviction cache of ``budget`` tokens: eta = budget / ``--s4r-length``, the
    rank solved at that length (S4R's own window and scoring otherwise)."""
    return [
        f"compression.options.eta={round(budget / args.s4r_length, 4)}",
        f"compression.options.expected_length={args.s4r_length}",
    ]


def cell(r: dict) -> str:
    lo, hi = r["pass@1_ci95"]
    return f"{r['pass@1']:.3f} [{lo:.2f}, {hi:.2f}]"


def ordering_table(section: dict) -> str:
    """pass@1 [95% interval] and the memory share reached per method (rows) and budget (columns); the full
    cache's on its own row; a budget not yet run: -."""
    budgets, table = section["budgets"], section["table"]
    lines = [
        "| method | " + " | ".join(f"budget {b} | memory" for b in budgets) + " |",
        "|---|" + "---|---|" * len(budgets),
    ]
    if table["full"] is not None:
        lines.append(f"| full | {cell(table['full'])} (every budget) | 1.00 |" + " | |" * (len(budgets) - 1))
    for method, by_budget in table["methods"].items():
        cells = [
            (cell(r), f"{r.get('memory_share', r['retention']):.2f}") if (r := by_budget.get(str(b))) else ("-", "-")
            for b in budgets
        ]
        lines.append(f"| {method} | " + " | ".join(f"{c} | {m}" for c, m in cells) + " |")
    for name, r in section.get("adapters", {}).items():  # trained models
        lines.append(
            f"| {name} (trained), full | {cell(r['full'])} (every budget) | 1.00 |" + " | |" * (len(budgets) - 1)
        )
        cells = [
            (cell(c), f"{c['memory_share']:.2f}") if (c := r["compressed"].get(str(b))) else ("-", "-") for b in budgets
        ]
        lines.append(f"| {name} (trained), {r['method']} | " + " | ".join(f"{c} | {m}" for c, m in cells) + " |")
    return "\n".join(lines) + "\n"
