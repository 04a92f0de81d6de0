"""S4R's own evidence at CPU scale: the RULER-style retrieval tasks (``gkv_train.problems.retrieval``), the full cache
against S4R and the eviction methods at the same persistent memory, and S4R's ablations; one JSON line.

Stages (``--stages``, each resumable: every run is a ``scripts/evaluate.py`` folder, which resumes batch by batch):

1. ``probe``: the full cache on the *train* split of every task at every ``--contexts`` length; per task the
   longest context where pass@1 >= ``--min-full`` is the one the next stages use (none: that task is left out).
2. ``table`` (the paper's Table 2): held-out problems at each task's context: the full cache; S4R at each
   ``--etas``; ``--methods`` (eviction) at the same persistent memory: budget = eta x (prompt + new tokens),
   the prompt taken as context + ``--prompt-overhead`` tokens (the facts and the question), compressed after
   the prefill (answers are short). Every row reports the memory share it reached (eviction: its retention;
   S4R: its stored state).
3. ``ablations``: S4R at the largest eta (where it scores most, so that a variant's effect shows above the
   floor) with sinks off (``sinks=0``), without normalisation (``normalize=false``), windows ``W`` of
   ``--windows`` and average pooling.
4. ``fair`` (S4R on a fair test, the paper's setting as closely as this machine allows): ``--fair-tasks`` at
   ``--fair-context`` tokens in every haystack of ``--haystacks`` (``filler``, RULER's noise; ``questions``,
   natural text), ``--fair-problems`` held-out problems each: the full cache; S4R at each ``--fair-etas`` (rho = eta)
   and its controls (``FAIR_CONTROLS``: the chosen tokens' exact keys and values, i.e. the selection alone;
   exact values; exact keys; the bases fitted on the whole prompt; a larger value rank at the same coefficient
   budget, the paper's Table 8); SnapKV and G-KV at the budget that matches the memory S4R's row reached. Every
   row is also split by where the asked needle lies: inside the block of recent prompt tokens S4R samples for its
   bases, or before it (``needle_in_recent_block``).

pass@1 with 95% bootstrap intervals over problems; greedy decoding (``--samples`` 1). Writes
``<output-root>/summary.json`` and, with ``--results FILE``, each stage's section into FILE as it is written.

    python scripts/bench_retrieval.py --stages probe            # SmolLM2-135M
    python scripts/bench_retrieval.py --quick                   # tiny model and sizes (a test runs it)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from gkv_rollout.config import CompressionConfig
from gkv_train.argument_types import (
    count,
    fraction,
    natural,
    nonnegative_number,
    output_file,
    output_folder,
    positive_fraction,
)
from gkv_train.jsonio import dumps, write_atomically
from gkv_train.problems.retrieval import HAYSTACKS, RETRIEVAL_TASKS
from gkv_train.provenance import origin, provenance
from gkv_train.stats import bootstrap_interval

from _common import ROOT, merge_section, print_json

STAGES = ("probe", "table", "ablations", "fair")
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
        sys.executable,
        str(ROOT / "scripts" / "evaluate.py"),
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
    log(" ".join(command[2:]))
    subprocess.run(command, check=True, cwd=ROOT)
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


def fair_table(section: dict) -> str:
    """The fair test: per task and haystack, each eta's rows (S4R, its controls, the matched eviction methods) with
    pass@1, its paired difference from S4R's row, the memory share reached, and pass@1 with the needle inside /
    before S4R's recent block."""
    rows = [
        "| task / haystack | full | eta | row | pass@1 | minus S4R (paired) | memory | needle inside the recent block "
        "| needle before it |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def paired(r: dict) -> str:
        d, (low, high) = r["minus_s4r"]["difference"], r["minus_s4r"]["ci95"]
        return f"{d:+.2f} [{low:+.2f}, {high:+.2f}]"

    def part(by: dict) -> str:
        return "-" if by["pass@1"] is None else f"{by['pass@1']:.2f} ({by['problems']})"

    for name, entry in section["table"].items():
        for eta, cells in entry["etas"].items():
            for row_name, r in ((k, v) for k, v in cells.items() if isinstance(v, dict)):
                label = row_name + (f" (budget {r['budget']})" if "budget" in r else "")
                rows.append(
                    f"| {name} | {cell(entry['full'])} | {eta} | {label} | {cell(r)} | "
                    f"{'-' if row_name == 's4r' else paired(r)} | {r['memory_share']:.3f} | "
                    f"{part(r['by_needle']['inside'])} | {part(r['by_needle']['before'])} |"
                )
    state = " (partial: runs still going)" if section.get("partial") else ""
    return "\n".join(rows) + f"\n\n{provenance(section)}{state}\n"


def cell(row: dict) -> str:
    low, high = row["pass@1_ci95"]
    ci = "" if low is None else f" [{low:.2f}, {high:.2f}]"
    return f"{row['pass@1']:.3f}{ci}"


def tables(view: str, result: dict) -> str:
    """``scripts/render_docs.py``'s views of a results file: ``probe`` (full-cache pass@1 per task and context,
    the context chosen), ``table`` (every method per task at each eta: pass@1 and the memory share reached),
    ``ablations`` (S4R's variants per task), each with where it came from."""
    section = result[view]
    if view == "fair":
        return fair_table(section)
    if view == "probe":
        contexts = sorted({int(c) for by in section["table"].values() for c in by})
        rows = [
            f"| task | {' | '.join(f'context {c}' for c in contexts)} | chosen |",
            "|---" * (len(contexts) + 2) + "|",
        ]
        for task, by in section["table"].items():
            cells = [cell(by[str(c)]) if str(c) in by else "-" for c in contexts]
            rows.append(f"| {task} | {' | '.join(cells)} | {section['chosen'].get(task) or 'none'} |")
    elif view == "table":
        methods = ["s4r", *section["methods"]]
        rows = [f"| task (context) | full | eta | {' | '.join(methods)} |", "|---" * (len(methods) + 3) + "|"]
        for task, entry in section["table"].items():
            for eta, at in entry["etas"].items():
                cells = [f"{cell(at[m])} (memory {at[m]['memory_share']:.2f})" for m in methods]
                rows.append(
                    f"| {task} ({entry['context']}) | {cell(entry['full'])} | {eta} (budget {at['budget']}) "
                    f"| {' | '.join(cells)} |"
                )
    else:
        variants = list(dict.fromkeys(v for by in section["table"].values() for v in by))
        rows = [f"| task | {' | '.join(variants)} |", "|---" * (len(variants) + 1) + "|"]
        for task, by in section["table"].items():
            rows.append(f"| {task} | {' | '.join(cell(by[v]) if v in by else '-' for v in variants)} |")
    state = " (partial: runs still going)" if section.get("partial") else ""
    return "\n".join(rows) + f"\n\n{provenance(section)}{state}\n"


def parse_arguments() -> argparse.Namespace:
    """The command line (``--quick``: every size tiny; the default stages filled in)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument(
        "--stages", nargs="+", choices=STAGES, help="default: probe, table, ablations (fair: some 20 core-hours, asked)"
    )
    parser.add_argument("--tasks", nargs="+", default=list(RETRIEVAL_TASKS), choices=RETRIEVAL_TASKS)
    parser.add_argument("--contexts", nargs="+", type=count, default=[512, 1024, 2048])
    parser.add_argument("--min-full", type=fraction, default=0.6)
    parser.add_argument("--probe-problems", type=count, default=32)
    parser.add_argument(
        "--max-context",
        type=count,
        default=None,
        help="table, ablations: at most this context (the longest passing one at or below it)",
    )
    parser.add_argument("--problems", type=count, default=64, help="table, ablations: held-out problems per task")
    parser.add_argument("--samples", type=count, default=1)
    parser.add_argument("--temperature", type=nonnegative_number, default=0.0)
    parser.add_argument("--max-new-tokens", type=count, default=48)
    parser.add_argument("--batch-problems", type=count, default=8)
    parser.add_argument("--etas", nargs="+", type=positive_fraction, default=[0.2, 0.4])
    parser.add_argument("--methods", nargs="+", default=["snapkv", "gkv", "streaming"])
    parser.add_argument(
        "--prompt-overhead", type=natural, default=100, help="tokens beyond the context: facts, question"
    )
    parser.add_argument("--windows", nargs="+", type=count, default=[1, 4, 32])
    parser.add_argument(
        "--ablations",
        nargs="+",
        default=None,
        help="only these variants (default, no_sinks, no_normalize, pool_avg, window_<W>)",
    )
    parser.add_argument(  # one asked needle, whose position the split by needle reads
        "--fair-tasks", nargs="+", default=["niah_single", "niah_multikey"], choices=["niah_single", "niah_multikey"]
    )
    parser.add_argument("--fair-context", type=count, default=2048, help="fair: the prompts' length in tokens")
    parser.add_argument(
        "--fair-etas", nargs="+", type=positive_fraction, default=[0.2, 0.4], help="fair: S4R's eta (rho = eta)"
    )
    parser.add_argument("--fair-problems", type=count, default=32, help="fair: held-out problems per task and haystack")
    parser.add_argument("--haystacks", nargs="+", default=list(HAYSTACKS), choices=HAYSTACKS)
    parser.add_argument("--fair-controls", nargs="+", default=list(FAIR_CONTROLS), choices=list(FAIR_CONTROLS))
    parser.add_argument("--fair-methods", nargs="+", default=["snapkv", "gkv"], help="fair: matched on memory")
    parser.add_argument("--seed", type=natural, default=0)
    parser.add_argument("--output-root", type=output_folder, default=ROOT / "outputs" / "retrieval")
    parser.add_argument(
        "--results", type=output_file, help="a results file whose stage sections are replaced as they come"
    )
    parser.add_argument("--quick", action="store_true", help="tiny model and sizes (a test runs it)")
    args = parser.parse_args()
    if args.quick:
        args.model, args.tasks, args.contexts, args.min_full = "tiny", ["vt"], [64], 0.0
        args.probe_problems, args.problems, args.max_new_tokens, args.windows = 2, 2, 4, [1, 32]
        args.ablations = ["default", "window_1"]
        args.fair_tasks, args.fair_context, args.fair_problems, args.haystacks = ["niah_single"], 96, 2, ["questions"]
        args.fair_controls, args.fair_methods, args.fair_etas = ["exact_both"], ["snapkv"], [0.4]
    if args.stages is None:
        args.stages = list(STAGES) if args.quick else [s for s in STAGES if s != "fair"]
    return args


def main() -> None:
    args = parse_arguments()
    root = args.output_root
    root.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "retrieval",
        "model": args.model,
        "greedy": args.temperature == 0,
        "max_new_tokens": args.max_new_tokens,
    }
    where = origin()
    summary_path = root / "summary.json"
    done = json.loads(summary_path.read_text()) if summary_path.is_file() else {}

    def publish(stage: str, section: dict) -> None:
        if args.results is not None:
            merge_section(
                args.results,
                stage,
                {**section, **where, "date": time.strftime("%Y-%m-%d")},
                {k: v for k, v in result.items() if k not in STAGES},
            )

    for stage in args.stages:
        if stage == "probe":
            section = stage_probe(root, args)
        elif stage == "fair":
            section = stage_fair(root, args, lambda section: publish("fair", section))
        else:
            probe = result.get("probe") or done.get("probe")
            if probe is None:
                raise SystemExit(
                    "error: the table and ablations need the probe's chosen contexts: run --stages probe first"
                )
            chosen = capped(probe, args.max_context)
            if stage == "table":
                section = stage_table(root, chosen, args)
            else:
                section = stage_ablations(root, chosen, args, lambda section: publish("ablations", section))
        result[stage] = section
        publish(stage, section)
    write_atomically(summary_path, dumps({**done, **result}, indent=2))
    print_json(result)


if __name__ == "__main__":
    main()
