"""The stages of ``bench_training_effect``: the probe that chooses the setting, the teacher traces, each recipe's
``gkv-train train`` keys, the held-out evaluations and the compressed KL; each a ``gkv-train`` job in a process of
its own, read back when its folder holds it."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_train.evaluation.metrics import compressed_kl
from gkv_train.evaluation.traces import generate_traces
from gkv_train.evidence.regime import COMMAND
from gkv_train.jsonio import dumps, read_jsonl, write_atomically
from gkv_train.models import load_model
from gkv_train.problems.data import DataConfig, load_problems


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
    log(stage, " ".join(command[len(COMMAND) :]))
    subprocess.run(command, check=True)


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
        *COMMAND,
        "evaluate",
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
        *COMMAND,
        "traces",
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
