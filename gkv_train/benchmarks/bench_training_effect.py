"""Does training under the compressed cache close the compression gap? RL-Sparse, RL-Full, offline and on-policy
distillation from the same initial model, evaluated under the compression and with the full cache; one JSON line.

Stages (each resumable: a finished stage is read back, an interrupted one continues where it stopped):

1. ``probe``: the untrained model on probe problems of the built-in task's *train* split (never the held-out
   ones), full cache vs each candidate setting ``distractors:method:budget``; the chosen setting is the first
   candidate (in the order given) with full-cache accuracy >= ``--min-full`` and a gap >= ``--min-gap`` (an
   error names the figures when none qualifies).
2. ``train/<recipe>``: ``train.py recipe=<recipe>`` for every recipe, same initial model, optimizer steps,
   learning rate and rows per step (GRPO: prompts x samples; distillation: as many traces / prompts).
3. ``eval/<model>``: ``scripts/evaluate.py`` on the same held-out test problems for every model (untrained
   included), with the full cache and under the chosen compression: pass@1 with a 95% Wilson interval, mean
   completion length, retention.
4. ``kl/<model>``: mean per-token KL(full-cache teacher || model under the compression) on teacher traces of
   held-out problems, replayed through the model's compressed cache.
5. ``summary.json``, ``summary.md`` (the results table), ``training_effect.png`` and the JSON line.

    python scripts/bench_training_effect.py                 # the full bench (about 2 hours on 2 free CPU cores)
    python scripts/bench_training_effect.py --quick         # every stage on tiny settings (minutes)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from gkv_train.argument_types import (
    count,
    fraction,
    natural,
    nonnegative_number,
    output_folder,
    positive_fraction,
    positive_number,
)
from gkv_train.benchmarks.training_effect_stages import (
    candidate,
    evaluate_models,
    log,
    run,
    stage_probe,
    train_keys,
    training_traces,
)
from gkv_train.evidence.regime import COMMAND
from gkv_train.jsonio import dumps, print_json, write_atomically
from gkv_train.provenance import origin, provenance

RECIPES = ("rl_sparse", "rl_full", "distill", "distill_onpolicy")
CACHES = ("compressed", "full")


def probe_table(summary: dict) -> str:
    """The probe's candidates (train split): full-cache and compressed pass@1 [95% Wilson interval], the gap and
    the retention; the chosen one marked."""
    lines = ["| candidate | full cache | compressed | gap | retention |", "|---|---|---|---|---|"]
    for c in summary["probe"]["candidates"]:
        chosen = " (chosen)" if c["candidate"] == summary["probe"]["chosen"] else ""
        full, compressed = c["full"], c["compressed"]
        lines.append(
            f"| {c['distractors']} distractors, {c['method']} budget {c['budget']}{chosen} "
            f"| {full['pass@1']:.3f} [{full['ci95'][0]:.3f}, {full['ci95'][1]:.3f}] "
            f"| {compressed['pass@1']:.3f} [{compressed['ci95'][0]:.3f}, {compressed['ci95'][1]:.3f}] "
            f"| {c['gap']:.2f} | {compressed['retention']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def tables(view: str, summary: dict) -> str:
    """``scripts/render_docs.py``'s views of the results file: ``probe`` (the candidates) and ``models`` (the
    results table), each with where it came from."""
    views = {"probe": probe_table, "models": markdown_table}
    if view not in views:
        raise SystemExit(f"error: bench_training_effect has the views {', '.join(views)}, not {view!r}")
    table = views[view](summary)
    return f"{table}\n{provenance(summary)}\n"


def markdown_table(summary: dict) -> str:
    """The results table (docs/benchmarks/training_effect.md): per model, pass@1 [95% interval] under the
    compression and with the full cache, the gap, mean completion length and retention under the compression, and
    the compressed KL to the teacher."""
    c = summary["compression"]
    lines = [
        f"| model | {c['method']} budget {c['budget']} | full cache | gap | length | retention | KL to teacher |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, m in summary["models"].items():
        cell = {k: f"{m[k]['pass@1']:.3f} [{m[k]['ci95'][0]:.3f}, {m[k]['ci95'][1]:.3f}]" for k in CACHES}
        compressed, kl = m["compressed"], m["kl_full_teacher_vs_compressed"]["kl"]
        lines.append(
            f"| {name} | {cell['compressed']} | {cell['full']} | {m['gap']:+.3f} | {compressed['mean_length']:.1f} "
            f"| {compressed['retention']:.2f} | {kl:.4f} |"
        )
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["models"])
    fig, ax = plt.subplots(figsize=(7, 4))
    for offset, (cache, color) in enumerate((("compressed", "tab:red"), ("full", "tab:blue"))):
        xs = [i + (offset - 0.5) * 0.3 for i in range(len(names))]
        ys = [summary["models"][n][cache]["pass@1"] for n in names]
        lo = [y - summary["models"][n][cache]["ci95"][0] for n, y in zip(names, ys)]
        hi = [summary["models"][n][cache]["ci95"][1] - y for n, y in zip(names, ys)]
        method, budget = summary["compression"]["method"], summary["compression"]["budget"]
        label = "full cache" if cache == "full" else f"{method} budget {budget}"
        ax.bar(xs, ys, width=0.3, yerr=[lo, hi], capsize=3, color=color, label=label)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylim(0, 1)
    ax.set_ylabel("pass@1 (95% Wilson interval)")
    ax.set_title(
        f"{summary['model']}, built-in task (distractors {summary['task']['distractors']}), "
        f"{summary['eval_problems']} held-out problems"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_arguments() -> argparse.Namespace:
    """The command line (``--quick``: every size tiny)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--output-root", type=output_folder, default=Path("outputs/training_effect"))
    parser.add_argument("--quick", action="store_true", help="every stage on tiny settings (a test runs it)")
    parser.add_argument("--level", type=natural, default=0, help="built-in task level (0: recall the first fact)")
    parser.add_argument("--prompt-template", default="{problem} Reply with only the number.")
    parser.add_argument(
        "--candidates",
        nargs="+",
        type=candidate,
        default=["4:gkv:32", "8:gkv:40", "4:snapkv:32"],
        help="distractors:method:budget settings probed on train-split problems, preferred first",
    )
    parser.add_argument("--min-full", type=fraction, default=0.30)
    parser.add_argument("--min-gap", type=fraction, default=0.10)
    parser.add_argument("--probe-problems", type=count, default=96)
    parser.add_argument("--window", type=count, default=8)
    parser.add_argument("--interval", type=count, default=16)
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=RECIPES)
    parser.add_argument("--steps", type=count, default=30, help="optimizer steps of every recipe")
    parser.add_argument(
        "--save-steps", type=count, default=5, help="checkpoint interval (an interrupted recipe resumes)"
    )
    parser.add_argument("--prompts-per-step", type=count, default=2, help="GRPO prompts per step")
    parser.add_argument("--samples", type=count, default=8, help="GRPO samples per prompt (distillation: rows x this)")
    parser.add_argument("--train-problems", type=count, default=256)
    parser.add_argument("--trace-problems", type=count, default=128, help="offline distillation: teacher problems")
    parser.add_argument("--lr", type=positive_number, default=3e-4)
    parser.add_argument("--lora", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--max-new-tokens", type=count, default=10)
    parser.add_argument(
        "--overlong-clip",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="GRPO rl.overlong_advantage_clip (off: at 10 tokens nearly every completion is cut off)",
    )
    parser.add_argument("--temperature", type=nonnegative_number, default=0.6)
    parser.add_argument("--top-p", type=positive_fraction, default=0.95)
    parser.add_argument("--eval-problems", type=count, default=256)
    parser.add_argument("--samples-eval", type=count, default=1)
    parser.add_argument("--batch-problems", type=count, default=32)
    parser.add_argument("--kl-problems", type=count, default=64)
    parser.add_argument("--seed", type=natural, default=0)
    args = parser.parse_args()
    if args.quick:
        args.model, args.candidates, args.min_full, args.min_gap = "tiny", ["4:gkv:24"], 0.0, -1.0
        args.probe_problems, args.steps, args.save_steps, args.prompts_per_step, args.samples = 4, 1, 1, 1, 2
        args.train_problems, args.trace_problems, args.max_new_tokens = 8, 4, 12
        args.eval_problems, args.kl_problems, args.batch_problems = 4, 2, 4
    return args


def main() -> None:
    args = parse_arguments()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    root = args.output_root
    root.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    probe = stage_probe(args, root)
    chosen = next(c for c in probe["candidates"] if c["candidate"] == probe["chosen"])
    log("probe", f"chosen {probe['chosen']} (full {chosen['full']['pass@1']:.3f}, gap {chosen['gap']:.3f})")
    if "distill" in args.recipes:
        training_traces(chosen, root, args)
    for recipe in args.recipes:
        if not (root / "train" / recipe / "eval.json").is_file():
            run(
                [
                    *COMMAND,
                    "train",
                    *train_keys(recipe, chosen, root, args),
                    f"output_dir={root / 'train' / recipe}",
                ],
                f"train/{recipe}",
            )
    models = evaluate_models(chosen, root, args)
    summary = {
        "benchmark": "training_effect",
        "model": args.model,
        "quick": args.quick,
        "task": {"name": "arithmetic", "level": args.level, "distractors": chosen["distractors"]},
        "compression": {
            "method": chosen["method"],
            "budget": chosen["budget"],
            "window": args.window,
            "interval": args.interval,
        },
        "probe": probe,
        "eval_problems": args.eval_problems,
        "samples_per_problem": args.samples_eval,
        "prompt_template": args.prompt_template,
        "training": {
            "steps": args.steps,
            "overlong_advantage_clip": args.overlong_clip,
            "learning_rate": args.lr,
            "lr_search_budget": 1,
            "lora": args.lora,
            "grpo_prompts_per_step": args.prompts_per_step,
            "samples_per_prompt": args.samples,
            "distill_rows_per_step": args.prompts_per_step * args.samples,
            "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature,
        },
        "models": models,
        "seconds": round(time.perf_counter() - start, 1),
        **origin(),
    }
    write_atomically(root / "summary.json", dumps(summary, indent=2))
    plot(summary, root / "training_effect.png")
    write_atomically(root / "summary.md", tables("models", summary))
    print_json(summary)


if __name__ == "__main__":
    main()
