"""The stages of ``bench_retrieval`` (probe, table, ablations, fair): each a set of ``gkv-train evaluate`` calls
(resumable batch by batch from their folders), the context and budgets they choose, and the per-problem figures of
the fair test read back from the runs' samples."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from gkv_rollout.config import CompressionConfig
from gkv_train.evidence.regime import COMMAND
from gkv_train.stats import bootstrap_interval

S4R_SINKS = CompressionConfig(method="s4r").resolved.sinks

# S4R's controls in the fair test, each a row at every eta: what the reconstruction loses apart from what the
# selection misses, and the reconstruction's parts
FAIR_CONTROLS = {
    "exact_both": ["compression.exact=both"],
    "exact_values": ["compression.exact=values"],
    "exact_keys": ["compression.exact=keys"],
    "basis_prompt": ["compression.basis=prompt"],
    "values_1.5x": ["compression.rank_ratio=1.5"],
    "values_2x": ["compression.rank_ratio=2.0"],
}


def log(message: str) -> None:
    print(f"[retrieval {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def evaluate(
    task: str,
    context: int,
    split: str,
    problems: int,
    methods: list[str],
    budgets: list[int] | None,
    compression: list[str],
    out: Path,
    args,
    haystack: str = "filler",
) -> dict:
    """One ``scripts/evaluate.py`` call; each run's summary by its name."""
    command = [
        *COMMAND,
        "evaluate",
        f"model={args.model}",
        f"data.name={task}",
        f"data.split={split}",
        f"data.limit={problems}",
        f"data.context={context}",
        *([f"data.haystack={haystack}"] if haystack != "filler" else []),
        f"num_generations={args.samples}",
        f"max_completion_length={args.max_new_tokens}",
        f"temperature={args.temperature}",
        f"batch_problems={args.batch_problems}",
        f"methods=[{','.join(methods)}]",
        *([f"budgets=[{','.join(map(str, budgets))}]"] if budgets else []),
        *compression,
        f"output_dir={out}",
        "plots=false",
        f"seed={args.seed}",
    ]
    log(" ".join(command[len(COMMAND) :]))
    subprocess.run(command, check=True)
    return {r["run"]: r for r in json.loads((out / "summary.json").read_text())["runs"]}


def row(summary: dict) -> dict:
    keep = ("pass@1", "pass@1_ci95", "retention", "mean_completion_length", "verifier_errors")
    return {**{k: summary[k] for k in keep}, "memory_share": summary.get("memory_share", summary["retention"])}


def stage_probe(root: Path, args) -> dict:
    table, chosen = {}, {}
    for task in args.tasks:
        table[task] = {}
        for context in args.contexts:
            runs = evaluate(
                task,
                context,
                "train",
                args.probe_problems,
                ["full"],
                None,
                [],
                root / "probe" / f"{task}-{context}",
                args,
            )
            table[task][str(context)] = row(runs["full"])
        fits = [c for c in args.contexts if table[task][str(c)]["pass@1"] >= args.min_full]
        chosen[task] = max(fits) if fits else None
    return {
        "split": "train",
        "problems": args.probe_problems,
        "min_full": args.min_full,
        "table": table,
        "chosen": chosen,
    }


def capped(probe: dict, max_context: int | None) -> dict:
    """Per task, the context the table and ablations use: the probe's choice, or with ``max_context`` the longest
    passing context not above it (CPU time: a 2048-token prefill costs ~30 s a problem on one core)."""
    if max_context is None:
        return probe["chosen"]
    chosen = {
        task: max(
            (int(c) for c, r in by.items() if int(c) <= max_context and r["pass@1"] >= probe["min_full"]), default=None
        )
        for task, by in probe["table"].items()
    }
    if all(c is None for c in chosen.values()):
        raise SystemExit(f"error: no task passed the probe at a context <= {max_context}")
    for task in (t for t, c in chosen.items() if c is None and probe["chosen"].get(t) is not None):
        log(f"{task}: left out (it passed the probe only above --max-context {max_context})")
    return chosen


def budget_for(eta: float, context: int, args) -> int:
    return round(eta * (context + args.prompt_overhead + args.max_new_tokens))


def stage_table(root: Path, chosen: dict, args) -> dict:
    table = {}
    for task, context in chosen.items():
        if context is None:
            continue
        folder = root / "table" / f"{task}-{context}"
        budgets = [budget_for(eta, context, args) for eta in args.etas]
        runs = evaluate(
            task,
            context,
            "test",
            args.problems,
            ["full", *args.methods],
            budgets,
            ["compression.interval=100000"],
            folder,
            args,
        )  # prefill compression only
        entry = {"context": context, "full": row(runs["full"]), "etas": {}}
        for eta, budget in zip(args.etas, budgets):
            s4r = evaluate(
                task,
                context,
                "test",
                args.problems,
                ["s4r"],
                [budget],
                [f"compression.eta={eta}"],
                folder / f"s4r-eta{eta}",
                args,
            )
            entry["etas"][str(eta)] = {
                "budget": budget,
                "s4r": row(s4r[f"s4r-b{budget}"]),
                **{m: row(runs[f"{m}-b{budget}"]) for m in args.methods},
            }
        table[task] = entry
    return {
        "split": "test",
        "problems": args.problems,
        "etas": args.etas,
        "methods": args.methods,
        "max_context": args.max_context,
        "table": table,
    }


def ablation_variants(args) -> dict[str, list[str]]:
    variants = {
        "default": [],
        "no_sinks": ["compression.sinks=0"],
        "no_normalize": ["compression.normalize=false"],
        "pool_avg": ["compression.pool=avg"],
    }
    variants.update({f"window_{w}": [f"compression.window={w}"] for w in args.windows if w != 32})
    return variants


def stage_ablations(root: Path, chosen: dict, args, publish=lambda section: None) -> dict:
    """S4R's variants per task; ``publish(section)`` after every run (``"partial": true`` until the end)."""
    eta, table = max(args.etas), {}
    section = {
        "eta": eta,
        "split": "test",
        "problems": args.problems,
        "max_context": args.max_context,
        "table": table,
        "partial": True,
    }
    for task, context in chosen.items():
        if context is None:
            continue
        table[task] = {}
        for name, keys in ablation_variants(args).items():
            if args.ablations and name not in args.ablations:
                continue
            runs = evaluate(
                task,
                context,
                "test",
                args.problems,
                ["s4r"],
                None,
                [f"compression.eta={eta}", *keys],
                root / "ablations" / f"{task}-{context}-eta{eta}" / name,
                args,
            )
            (summary,) = runs.values()
            table[task][name] = row(summary)
            publish(section)
    section["partial"] = False
    return section


def needle_positions(task: str, context: int, haystack: str, problems: int, args) -> list[dict]:
    """Per held-out problem (in order): its prompt's token count and the index of the first token of the asked
    needle's number, in the prompt as ``scripts/evaluate.py`` writes it (template, chat template)."""
    from gkv_train.models import load_config_and_tokenizer
    from gkv_train.problems.data import DataConfig, load_problems

    data = DataConfig(name=task, split="test", limit=problems, context=context, haystack=haystack)
    rows = load_problems(data, args.seed)
    _, tokenizer = load_config_and_tokenizer(args.model)
    found = []
    for problem, answer in zip(rows["problem"], rows["answer"]):
        text = data.prompt_template.format(problem=problem)
        if tokenizer.chat_template:
            messages = [{"role": "user", "content": text}]
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        encoded = tokenizer(text, add_special_tokens=not tokenizer.chat_template, return_offsets_mapping=True)
        start = text.index(f"is: {answer}.") + len("is: ")
        needle = next(i for i, (_, end) in enumerate(encoded["offset_mapping"]) if end > start)
        found.append({"prompt": len(encoded["input_ids"]), "needle": needle})
    return found


def in_recent_block(position: dict, eta: float, sinks: int, recent_ratio: float = 0.7) -> bool:
    """Whether the needle lies in the block of the most recent prompt tokens S4R samples for its bases at
    ``eta`` (``gkv_rollout.lowrank.sample_positions``: the last round(0.7 count) of the count = round(eta n)
    non-sink tokens; the rank floor on the count does not bind at these lengths)."""
    rest = position["prompt"] - sinks
    recent = round(round(eta * rest) * recent_ratio)
    return position["needle"] >= position["prompt"] - recent


def correct_by_problem(folder: Path, run: str) -> list[float]:
    """pass@1 of each problem of one evaluation run (mean over its samples), by problem id."""
    by: dict[int, list[bool]] = {}
    for line in (folder / run / "samples.jsonl").read_text().splitlines():
        sample = json.loads(line)
        by.setdefault(sample["problem_id"], []).append(bool(sample["correct"]))
    return [sum(c) / len(c) for _, c in sorted(by.items())]


def minus(scores: list[float], reference: list[float]) -> dict:
    """A row's pass@1 minus another's on the same problems: the mean of the per-problem differences and its 95%
    bootstrap interval over problems."""
    differences = [a - b for a, b in zip(scores, reference, strict=True)]
    return {"difference": sum(differences) / len(differences), "ci95": bootstrap_interval(differences)}


def split_by_needle(scores: list[float], inside: list[bool]) -> dict:
    """pass@1 (and problem count) of the problems whose needle lies inside / before the recent block."""
    parts = {"inside": [s for s, i in zip(scores, inside) if i], "before": [s for s, i in zip(scores, inside) if not i]}
    return {where: {"problems": len(v), "pass@1": sum(v) / len(v) if v else None} for where, v in parts.items()}


def stage_fair(root: Path, args, publish=lambda section: None) -> dict:
    """The fair test (module docstring, stage 4); ``publish(section)`` after every cell (partial until the end)."""
    table: dict = {}
    section = {
        "split": "test",
        "context": args.fair_context,
        "problems": args.fair_problems,
        "etas": args.fair_etas,
        "controls": {name: FAIR_CONTROLS[name] for name in args.fair_controls},
        "matched_methods": args.fair_methods,
        "table": table,
        "partial": True,
    }
    context, n = args.fair_context, args.fair_problems
    for haystack in args.haystacks:
        for task in args.fair_tasks:
            folder = root / "fair" / f"{task}-{context}-{haystack}"
            positions = needle_positions(task, context, haystack, n, args)
            mean_prompt = sum(p["prompt"] for p in positions) / len(positions)
            full = evaluate(task, context, "test", n, ["full"], None, [], folder / "full", args, haystack)["full"]
            entry = table.setdefault(f"{task}/{haystack}", {"mean_prompt": mean_prompt, "full": row(full), "etas": {}})
            for eta in args.fair_etas:
                inside = [in_recent_block(p, eta, S4R_SINKS) for p in positions]
                cells = entry["etas"].setdefault(str(eta), {})
                s4r_scores: list[float] = []
                for name, keys in {"s4r": [], **{c: FAIR_CONTROLS[c] for c in args.fair_controls}}.items():
                    out = folder / f"eta{eta}" / name
                    (summary,) = evaluate(
                        task,
                        context,
                        "test",
                        n,
                        ["s4r"],
                        None,
                        [f"compression.eta={eta}", *keys],
                        out,
                        args,
                        haystack,
                    ).values()
                    scores = correct_by_problem(out, summary["run"])
                    if name == "s4r":  # the first row: every other row is paired with it
                        s4r_scores = scores
                    cells[name] = {
                        **row(summary),
                        "by_needle": split_by_needle(scores, inside),
                        "minus_s4r": minus(scores, s4r_scores),
                    }
                    publish(section)
                memory = cells["s4r"]["memory_share"]
                budget = round(memory * (mean_prompt + cells["s4r"]["mean_completion_length"]))
                out = folder / f"eta{eta}" / "matched"
                runs = evaluate(
                    task,
                    context,
                    "test",
                    n,
                    args.fair_methods,
                    [budget],
                    ["compression.interval=100000"],
                    out,
                    args,
                    haystack,
                )  # prefill compression only: answers are short
                for method in args.fair_methods:
                    run = f"{method}-b{budget}"
                    scores = correct_by_problem(out, run)
                    cells[method] = {
                        **row(runs[run]),
                        "budget": budget,
                        "by_needle": split_by_needle(scores, inside),
                        "minus_s4r": minus(scores, s4r_scores),
                    }
                cells["needle_inside_share"] = sum(inside) / len(inside)
                publish(section)
    section["partial"] = False
    return section
