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
import time
from pathlib import Path

from gkv_train.argument_types import (
    count,
    fraction,
    natural,
    nonnegative_number,
    output_file,
    output_folder,
    positive_fraction,
)
from gkv_train.benchmarks.retrieval_stages import (
    FAIR_CONTROLS,
    capped,
    stage_ablations,
    stage_fair,
    stage_probe,
    stage_table,
)
from gkv_train.jsonio import dumps, merge_section, print_json, write_atomically
from gkv_train.problems.retrieval import HAYSTACKS, RETRIEVAL_TASKS
from gkv_train.provenance import origin, provenance

STAGES = ("probe", "table", "ablations", "fair")


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
    parser.add_argument("--output-root", type=output_folder, default=Path("outputs/retrieval"))
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
