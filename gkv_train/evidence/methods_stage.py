"""The held-out method ordering of the decode-time regime (stage ``methods``): the full cache, every eviction
method, the G-KV forms and S4R at the same persistent memory, and trained adapters, each row published as it
arrives and taken back from a results file made with the same settings; the retained-position plot and the
ordering table (the intervals: ``gkv_train.stats`` through ``evaluate``)."""

from __future__ import annotations

import json
from pathlib import Path

from gkv_train.evaluation.report import plot_retained_density
from gkv_train.evidence.regime import evaluate, row, sampling_settings


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
                f"compression.form={form}",
            ]
            measure(
                f"gkv-{form}",
                budget,
                lambda e=extra, f=form: runs_of(["gkv"], budget, folder / f"gkv-{f}", e)[f"gkv-b{budget}"],
            )
        if args.s4r_length:
            eta = round(budget / args.s4r_length, 4)
            section["s4r"]["eta"][str(budget)] = eta
            extra = [f"compression.eta={eta}", f"compression.expected_length={args.s4r_length}"]
            measure("s4r", budget, lambda e=extra: runs_of(["s4r"], budget, folder, e)[f"s4r-b{budget}"])
            if args.s4r_refresh:  # the same memory, bases that follow the generation (docs/s4r.md)
                extra = [*extra, f"compression.refresh={args.s4r_refresh}"]
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
        f"compression.eta={round(budget / args.s4r_length, 4)}",
        f"compression.expected_length={args.s4r_length}",
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
