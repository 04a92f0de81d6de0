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
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch

from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_train.argument_types import (
    count,
    fraction,
    natural,
    nonnegative_number,
    output_folder,
    positive_fraction,
    positive_number,
)
from gkv_train.evaluation.metrics import compressed_kl
from gkv_train.evaluation.traces import generate_traces
from gkv_train.jsonio import dumps, read_jsonl, write_atomically
from gkv_train.models import load_model
from gkv_train.problems.data import DataConfig, load_problems
from gkv_train.provenance import origin, provenance

from _common import ROOT, print_json

RECIPES = ("rl_sparse", "rl_full", "distill", "distill_onpolicy")
CACHES = ("compressed", "full")


def wilson(correct: int, n: int, z: float = 1.96) -> list[float]:
    """95% Wilson score interval of a proportion."""
    if n == 0:
        return [0.0, 1.0]
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def log(stage: str, message: str) -> None:
    print(f"[training_effect {time.strftime('%H:%M:%S')}] {stage}: {message}", file=sys.stderr, flush=True)


def run(command: list[str], stage: str) -> None:
    log(stage, " ".join(command[1:]))
    subprocess.run(command, check=True, cwd=ROOT)


def compression_keys(method: str, budget: int, args) -> list[str]:
    return [
        f"compression.method={method}",
        f"compression.budget={budget}",
        f"compression.window={args.window}",
        f"compression.interval={args.interval}",
    ]


def evaluate(
    model_args: list[str], data_keys: list[str], method: str, budget: int, out: Path, args, stage: str, seed: int
) -> dict:
    """``scripts/evaluate.py`` with the full cache and under ``method``/``budget``; per run: pass@1, its Wilson
    interval, mean completion length, retention."""
    command = [
        sys.executable,
        str(ROOT / "scripts" / "evaluate.py"),
        *model_args,
        *data_keys,
        f"num_generations={args.samples_eval}",
        f"max_completion_length={args.max_new_tokens}",
        f"temperature={args.temperature}",
        f"top_p={args.top_p}",
        f"batch_problems={args.batch_problems}",
        f"methods=[full,{method}]",
        f"budgets=[{budget}]",
        f"compression.window={args.window}",
        f"compression.interval={args.interval}",
        f"output_dir={out}",
        "plots=false",
        f"seed={seed}",
    ]
    run(command, stage)
    results = {}
    for cache, folder in (("full", "full"), ("compressed", f"{method}-b{budget}")):
        samples = list(read_jsonl(out / folder / "samples.jsonl"))
        correct = sum(s["correct"] for s in samples)
        results[cache] = {
            "pass@1": correct / len(samples),
            "ci95": wilson(correct, len(samples)),
            "samples": len(samples),
            "mean_length": sum(s["length"] for s in samples) / len(samples),
            "retention": sum(s["retention"] for s in samples) / len(samples),
        }
    return results


def candidate(text: str) -> str:
    """``--candidates``' argparse type: ``distractors:method:budget`` (an integer >= 0, an eviction method, a budget
    >= 1), checked before any work rather than when the probe reaches it."""
    from gkv_rollout.registry import eviction_methods

    parts = text.split(":")
    if len(parts) != 3 or not parts[0].isdecimal() or parts[1] not in eviction_methods() or not parts[2].isdecimal():
        raise argparse.ArgumentTypeError(f"{text!r}: expected distractors:method:budget, such as 4:gkv:32")
    if int(parts[2]) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the budget must be at least 1")
    return text


def stage_probe(args, root: Path) -> dict:
    path = root / "probe.json"
    if path.is_file():
        return json.loads(path.read_text())
    rows = []
    for candidate in args.candidates:
        distractors, method, budget = candidate.split(":")
        data = [
            "data.name=arithmetic",
            "data.split=train",
            f"data.levels=[{args.level}]",
            f"data.distractors={distractors}",
            f"data.limit={args.probe_problems}",
            template_key("data", args),
        ]
        out = root / "probe" / candidate.replace(":", "_")
        # a seed other than training's: other train-split problems than the first training prompts
        result = evaluate([f"model={args.model}"], data, method, int(budget), out, args, "probe", args.seed + 1)
        gap = result["full"]["pass@1"] - result["compressed"]["pass@1"]
        rows.append(
            {
                "candidate": candidate,
                "distractors": int(distractors),
                "method": method,
                "budget": int(budget),
                "full": result["full"],
                "compressed": result["compressed"],
                "gap": gap,
            }
        )
        full, compressed = result["full"]["pass@1"], result["compressed"]["pass@1"]
        log("probe", f"{candidate}: full {full:.3f}, compressed {compressed:.3f}")
    qualified = [r for r in rows if r["full"]["pass@1"] >= args.min_full and r["gap"] >= args.min_gap]
    if not qualified:
        table = ", ".join(f"{r['candidate']}: full {r['full']['pass@1']:.2f} gap {r['gap']:.2f}" for r in rows)
        raise SystemExit(f"no candidate has full-cache accuracy >= {args.min_full} and gap >= {args.min_gap}: {table}")
    chosen = qualified[0]
    probe = {"problems": args.probe_problems, "split": "train", "candidates": rows, "chosen": chosen["candidate"]}
    write_atomically(path, dumps(probe, indent=2))
    return probe


def template_key(group: str, args) -> str:
    return f"{group}.prompt_template='{args.prompt_template}'"  # quoted: Hydra would read {...} as a dict


def train_keys(recipe: str, chosen: dict, root: Path, args) -> list[str]:
    distill = recipe.startswith("distill")
    rows = args.prompts_per_step * args.samples
    keys = [
        f"recipe={recipe}",
        f"model={args.model}",
        "data.name=arithmetic",
        f"data.levels=[{args.level}]",
        f"data.distractors={chosen['distractors']}",
        f"data.limit={args.train_problems}",
        f"eval_data.levels=[{args.level}]",
        f"eval_data.distractors={chosen['distractors']}",
        "eval_data.limit=8",
        template_key("data", args),
        template_key("eval_data", args),
        f"max_steps={args.steps}",
        f"learning_rate={args.lr}",
        f"max_completion_length={args.max_new_tokens}",
        f"temperature={args.temperature}",
        f"top_p={args.top_p}",
        f"seed={args.seed}",
        f"save_steps={args.save_steps}",
        f"lora.enabled={str(args.lora).lower()}",
        "resume=last",
        f"prompts_per_step={rows if distill else args.prompts_per_step}",
    ]
    if not distill:
        keys += [
            f"num_generations={args.samples}",
            f"rl.overlong_advantage_clip={str(args.overlong_clip).lower()}",
        ]
    if recipe != "rl_full":
        keys += compression_keys(chosen["method"], chosen["budget"], args)
    if recipe == "distill":
        keys.append(f"distill.traces={root / 'train' / 'teacher_traces.jsonl'}")
    return keys


def training_traces(chosen: dict, root: Path, args) -> None:
    """Offline distillation's data: the full-cache teacher's (the initial model's) correct completions of
    training problems (``--quick``: wrong ones too, a random tiny model solves nothing), by generate_traces.py."""
    path = root / "train" / "teacher_traces.jsonl"
    if path.is_file():
        return
    command = [
        sys.executable,
        str(ROOT / "scripts" / "generate_traces.py"),
        f"model={args.model}",
        "data.name=arithmetic",
        f"data.levels=[{args.level}]",
        f"data.distractors={chosen['distractors']}",
        f"data.limit={args.trace_problems}",
        f"num_generations={args.samples}",
        f"max_completion_length={args.max_new_tokens}",
        f"temperature={args.temperature}",
        f"top_p={args.top_p}",
        f"seed={args.seed}",
        template_key("data", args),
        f"output={path.with_suffix('.partial')}",
    ]
    run(command + (["keep_incorrect=true"] if args.quick else []), "train/teacher_traces")
    path.with_suffix(".partial").rename(path)


def model_args(name: str, root: Path, args) -> list[str]:
    if name == "untrained":
        return [f"model={args.model}"]
    out = root / "train" / name
    return [f"model={args.model}", f"adapter={out}"] if args.lora else [f"model={out}"]


def stage_kl(name: str, chosen: dict, root: Path, args, traces: list[dict]) -> dict:
    path = root / "kl" / f"{name}.json"
    if path.is_file():
        return json.loads(path.read_text())
    log("kl", name)
    teacher, tokenizer = load_model(args.model)
    if name == "untrained":
        model = teacher
    elif args.lora:  # merged into its base (float rounding away from the adapter applied beside it)
        model = load_model(args.model, adapter=str(root / "train" / name))[0]
    else:
        model = load_model(str(root / "train" / name))[0]
    compression = CompressionConfig(
        chosen["method"], budget=chosen["budget"], window=args.window, interval=args.interval
    )
    result = compressed_kl(teacher, model, tokenizer, traces, compression)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, dumps(result))
    return result


def held_out_traces(chosen: dict, root: Path, args) -> list[dict]:
    """Full-cache teacher (the untrained model) traces of held-out problems, right or wrong."""
    path = root / "kl" / "teacher_traces.jsonl"
    if path.is_file():
        return list(read_jsonl(path))
    log("kl", f"teacher traces of {args.kl_problems} held-out problems")
    data = DataConfig(
        name="arithmetic",
        split="test",
        limit=args.kl_problems,
        levels=[args.level],
        distractors=chosen["distractors"],
        prompt_template=args.prompt_template,
    )
    problems = load_problems(data, args.seed)
    model, tokenizer = load_model(args.model)
    sampling = SamplingConfig(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed
    )
    rows = generate_traces(model, tokenizer, problems, sampling, data.prompt_template, keep_incorrect=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, "".join(dumps(r) + "\n" for r in rows))
    return rows


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
    parser.add_argument("--output-root", type=output_folder, default=ROOT / "outputs" / "training_effect")
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


def evaluate_models(chosen: dict, root: Path, args) -> dict:
    """The untrained model and every trained one on the held-out problems, with the full cache and under the
    chosen compression, each with its KL to the full-cache teacher (a finished evaluation is read back)."""
    data = [
        "data.name=arithmetic",
        "data.split=test",
        f"data.levels=[{args.level}]",
        f"data.distractors={chosen['distractors']}",
        f"data.limit={args.eval_problems}",
        template_key("data", args),
    ]
    traces = held_out_traces(chosen, root, args)
    models = {}
    for name in ["untrained", *args.recipes]:
        done = root / "eval" / f"{name}.json"
        if done.is_file():
            result = json.loads(done.read_text())
        else:
            result = evaluate(
                model_args(name, root, args),
                data,
                chosen["method"],
                chosen["budget"],
                root / "eval" / name,
                args,
                f"eval/{name}",
                args.seed,
            )
            result["gap"] = result["full"]["pass@1"] - result["compressed"]["pass@1"]
            write_atomically(done, dumps(result, indent=2))
        result["kl_full_teacher_vs_compressed"] = stage_kl(name, chosen, root, args, traces)
        models[name] = result
        log(f"eval/{name}", f"compressed {result['compressed']['pass@1']:.3f}, full {result['full']['pass@1']:.3f}")
    return models


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
                    sys.executable,
                    str(ROOT / "train.py"),
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
