"""The decode-time regime: many compressions while a long completion is written, on the built-in task
``copy_recall`` (the number the answer needs is written ~120 tokens before it is needed), or (``--task
long_recall``, probe and methods) at reasoning lengths: ``--sentences`` 80 make a completion of about 1,000 tokens
that the engine feeds as given before the number is sampled; one JSON line.

Stages (``--stages``, each resumable: every run is a ``scripts/evaluate.py`` folder, which resumes batch by batch,
or a ``train.py`` folder, which resumes from its last checkpoint; a finished one is read back):

1. ``probe``: the untrained model on problems of the task's *train* split (never the held-out ones), the full
   cache and every eviction method at every budget, same prompts, samples and seed: pass@1 with a 95% interval,
   the gap to the full cache, mean completion length, retention and compression rounds per batch (the
   prefill's included: what follows it are the decode-time compressions), and the three checks the regime
   needs: full-cache pass@1 >= ``--min-full``, at least ``--min-decode-compressions`` rounds after the
   prefill's, and a gap >= ``--min-gap`` for some method.
2. ``methods``: the same table on ``--methods-problems`` *held-out* problems x ``--methods-samples``, budget by
   budget in the order given, and besides the eviction methods the G-KV history forms (``--gkv-forms``; ``max``
   is the ``gkv`` row) and S4R at the same persistent memory (``--s4r-length``: ``eta = budget / length`` with
   the rank solved at that length, where an eviction cache of ``budget`` tokens holds the same share; S4R's own
   window and scoring defaults); every row's memory share reached (eviction: its retention; S4R: its stored
   state), and the retained-position density of every row at the first budget (G-KV's Fig. 7,
   ``methods_density.png``). With ``--adapters NAME=DIR``, each trained LoRA adapter on the same problems with
   the full cache and under ``--train-method`` at every budget (the ``adapters`` rows). The section is written after
   every ``evaluate.py`` call (``"partial": true`` until the stage ends), to ``--results`` too when given.
3. ``training``: every recipe of ``--recipes`` from the same initial model with the same optimizer steps,
   learning rate (one value: the learning-rate search budget is 1), prompts and rows per step, under
   ``--train-method`` at ``--train-budget`` (``rl_full``: the full cache); then every model, the untrained one
   included, on the same held-out problems with the full cache and under the training method at the training
   budget, a tighter and a looser one (``--eval-budgets``); the per-step training curves (``reward``: the
   reward of the step's own rollouts, under the recipe's cache) in one plot; the mismatch telemetry (ratio
   quantiles, agreement tail) per recipe, averaged over steps.

Writes ``<output-root>/<stage>/summary.json`` per stage, ``summary.json`` (one section per stage run),
``summary.md`` (the tables), ``training_curves.png``, ``methods_density.png``, and the JSON line; with
``--results FILE``, each stage's section (with the command, date and commit) replaces that stage's section of
FILE as it is written, the other stages' sections kept.

    python scripts/bench_decode_regime.py --stages probe        # SmolLM2-135M (about 25 minutes on one core)
    python scripts/bench_decode_regime.py --stages training     # about 2 hours on 2 cores
    python scripts/bench_decode_regime.py --quick               # every stage, a tiny random model (a test runs it)
    python scripts/bench_decode_regime.py --task long_recall --sentences 80 --max-new-tokens 1040 --stages probe
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gkv_train.argument_types import count, positive_number
from gkv_train.benchmarks.decode_regime_stages import RECIPES, stage_training
from gkv_train.evidence.methods_stage import cell, ordering_table, stage_methods
from gkv_train.evidence.regime import (
    add_arguments,
    check_arguments,
    ordering,
)
from gkv_train.jsonio import dumps, merge_section, print_json, write_atomically
from gkv_train.provenance import origin, provenance

STAGES = ("probe", "methods", "training")


def training_table(section: dict) -> str:
    """Per model: pass@1 [95% interval] with the full cache and under each evaluated method and budget (the
    training method's first; ``-``: not evaluated), the agreement tail, and where the row was measured."""
    models = section["models"]
    methods = sorted(
        {m for r in models.values() for m in r["compressed"]}, key=lambda m: (m != section["train_method"], m)
    )
    columns = [(m, b) for m in methods for b in section["eval_budgets"]]
    lines = [
        "| model | rollout | full cache | "
        + " | ".join(f"{m} b{b}" for m, b in columns)
        + " | agreement p5 | measured |",
        "|---|---|---|" + "---|" * (len(columns) + 2),
    ]
    for name, r in models.items():
        agreement = r.get("curve", {}).get("telemetry", {}).get("mismatch/agreement_p5")
        measured = r.get("measured") or {k: section.get(k) for k in ("date", "commit")}
        extended = r.get("extended", [])
        where = ", ".join(
            [
                f"{measured['date']} {measured['commit']}" if measured.get("date") else "-",
                *(f"{w['date']} {w['commit']} (cells added)" for w in extended),
            ]
        )
        lines.append(
            f"| {name} | {r.get('rollout', '-')} | {cell(r['full'])} | "
            + " | ".join(cell(c) if (c := r["compressed"].get(m, {}).get(str(b))) else "-" for m, b in columns)
            + f" | {'-' if agreement is None else f'{agreement:.4f}'} | {where} |"
        )
    return "\n".join(lines) + "\n"


def plot_curves(section: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, r in section["models"].items():
        points = r.get("curve", {}).get("reward", [])
        if points:
            ax.plot(
                [s for s, _ in points],
                [v for _, v in points],
                marker="o",
                markersize=3,
                label=f"{name} ({r['rollout']})",
            )
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("reward of the step's rollouts")
    ax.set_ylim(0, 1)
    ax.set_title(f"copy_recall, budget {section['train_budget']}: each recipe under its rollout cache (in brackets)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def stage_table(stage: str, section: dict) -> str:
    """The markdown of one stage's section, with where it came from."""
    table = training_table(section) if stage == "training" else ordering_table(section)
    state = " (partial: rows still running)" if section.get("partial") else ""
    return f"{table}\n{provenance(section)}{state}\n"


def tables(view: str, result: dict) -> str:
    """``scripts/render_docs.py``'s view: the table of stage ``view`` of a results file."""
    return stage_table(view, result[view])


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)  # the regime's (the task, sampling, the ordering stages): _regime.py
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    parser.add_argument("--quick", action="store_true", help="every stage, tiny model and sizes (a test runs it)")
    parser.add_argument(
        "--recipes",
        nargs="+",
        default=["rl_sparse", "sparse_rl", "rl_full", "distill_onpolicy"],
        choices=list(RECIPES),
        help="training: in this order (rl_sparse_snapkv, rl_sparse_s4r, distill: also)",
    )
    parser.add_argument(
        "--replace-training",
        action="store_true",
        help="training: replace a --results training section measured with other settings",
    )
    parser.add_argument("--train-budget", type=count, default=160)
    parser.add_argument(
        "--eval-budgets",
        nargs="+",
        type=count,
        default=[128, 160, 224],
        help="training: held-out evaluation budgets (tighter, the training one, looser)",
    )
    parser.add_argument("--steps", type=count, default=12, help="training: optimizer steps of every recipe")
    parser.add_argument("--save-steps", type=count, default=2, help="training: checkpoint interval (resume)")
    parser.add_argument("--prompts-per-step", type=count, default=2, help="training: GRPO prompts per step")
    parser.add_argument(
        "--group-size",
        type=count,
        default=2,
        help="training: GRPO samples per prompt (distillation: prompts-per-step x this rows per step)",
    )
    parser.add_argument("--train-problems", type=count, default=256)
    parser.add_argument("--trace-problems", type=count, default=64, help="training, offline distill: teacher problems")
    parser.add_argument("--lr", type=positive_number, default=3e-4, help="training: the one learning rate (LoRA)")
    parser.add_argument("--eval-problems", type=count, default=32, help="training: held-out problems")
    parser.add_argument("--eval-samples", type=count, default=2)
    args = parser.parse_args(argv)
    if args.task == "long_recall" and "training" in args.stages:
        parser.error("--task long_recall: the probe and methods stages (its training: bench_rl_evidence.py)")
    if args.quick:
        args.model, args.problems, args.samples, args.methods, args.budgets = "tiny", 2, 2, ["gkv"], [24]
        args.max_new_tokens, args.batch_problems, args.sentences, args.interval = 24, 2, 2, 8
        if args.task == "long_recall":  # the given story (the tiny tokenizer: ~190 tokens at 2 sentences), the number
            args.max_new_tokens = 224
        args.methods_problems, args.methods_samples, args.train_budget, args.eval_budgets = 2, 1, 24, [24]
        args.gkv_forms, args.s4r_length, args.s4r_refresh = ["max", "mean"], 96, 8
        args.steps, args.save_steps, args.prompts_per_step, args.train_problems = 1, 1, 1, 4
        args.trace_problems, args.eval_problems, args.eval_samples = 2, 2, 1
        if args.recipes == parser.get_default("recipes"):  # the record's learner (the dense one: test_train.py)
            args.recipes = ["rl_sparse"]
    check_arguments(parser, args)  # the model the adapters are checked against: --quick's too
    return args


def main() -> None:
    args = parse_arguments()
    root = args.output_root
    root.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    result = {
        "benchmark": "decode_regime",
        "model": args.model,
        "quick": args.quick,
        "task": {"name": args.task, "sentences": args.sentences, "copy_required": args.copy_required},
        "compression": {"window": args.window, "interval": args.interval},
        "sampling": {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p},
    }
    tables = []
    where = origin()

    def publish(stage: str, section: dict) -> None:
        (root / stage).mkdir(parents=True, exist_ok=True)
        write_atomically(root / stage / "summary.json", dumps(section, indent=2))
        if args.results is not None:
            header = {k: v for k, v in result.items() if k not in STAGES}
            merge_section(args.results, stage, {**section, **where, "date": time.strftime("%Y-%m-%d")}, header)

    for stage in args.stages:
        if stage == "probe":
            section = ordering("probe", "train", args.problems, args.samples, root, args)
            tables.append(f"## probe (train split)\n\n{ordering_table(section)}")
        elif stage == "methods":
            section = stage_methods(root, args, lambda section: publish("methods", section))
            tables.append(f"## methods (held-out)\n\n{ordering_table(section)}")
        else:
            section = stage_training(root, args, lambda section: publish("training", section))
            plot_curves(section, root / "training_curves.png")
            tables.append(f"## training\n\n{training_table(section)}")
        publish(stage, section)
        result[stage] = section
    result["seconds"] = round(time.perf_counter() - start, 1)
    write_atomically(root / "summary.json", dumps(result, indent=2))
    write_atomically(root / "summary.md", "\n".join(tables))
    print_json(result)


if __name__ == "__main__":
    main()
