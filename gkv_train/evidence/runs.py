"""``gkv-train compare``'s jobs as commands: a training run's ``train`` keys, the teacher traces, an evaluation of
an lr-stage model or of any model under one condition, the fp16 adapter kept of each run, and the check that fresh
problems share none with any set the comparison draws."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gkv_train.evidence import regime
from gkv_train.evidence.design import (
    DISTILL,
    RUN_EVAL_PROBLEMS,
    TASKS,
    TRACE_SEED,
    TRACES,
    Job,
    base_recipe,
    log,
    parse_condition,
    reward,
    run_name,
    task_settings,
    variant_overrides,
)


def regime_args(args, extra: list[str] | None = None) -> argparse.Namespace:
    """The regime's arguments for this task (``gkv_train.evidence.regime``: its probe, methods and evaluate helpers
    read them)."""
    variant = ["--copy-required", "places", "--copy-share", str(args.copy_share)] if args.task == "copy_recall" else []
    size = ["--count-to", str(args.count_to)] if args.task == "count_recall" else []
    size += ["--sentences", str(args.sentences)] if args.task in ("copy_recall", "long_recall") else []
    if not args.number_in_prompt:
        size += ["--number-in-prompt", "false"]
    source = ["--data-path", args.data_path] if args.data_path else ["--task", args.task]
    argv = [
        "--model",
        args.model,
        *source,
        *size,
        *variant,
        "--min-full",
        str(args.min_full),
        "--min-decode-compressions",
        str(args.min_rounds),
        "--window",
        str(args.window),
        "--interval",
        str(args.interval),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--temperature",
        str(args.temperature),
        "--top-p",
        str(args.top_p),
        "--batch-problems",
        str(args.batch_problems),
        "--output-root",
        str(args.output_root),
        "--seed",
        "0",
        *(extra or []),
    ]
    parser = argparse.ArgumentParser()
    regime.add_arguments(parser)
    found = parser.parse_args(argv)
    regime.check_arguments(parser, found)
    return found


def train_keys(name: str, seed: int, lr: float, args, make_traces: bool = True) -> list[str]:
    """``train.py``'s overrides of one run of ``name`` (a recipe or a ``--variant``): the recipe under G-KV at the
    training budget (``rl_full``: the full cache), ``--steps`` optimizer steps of ``--prompts-per-step`` x
    ``--group-size`` rows, then the variant's own overrides. ``distill`` names the teacher traces, generated first
    unless ``make_traces`` is false."""
    task = regime_args(args)
    recipe = base_recipe(name, args)
    distill = recipe in DISTILL
    rows = args.prompts_per_step * args.group_size
    keys = [
        f"recipe={recipe}",
        f"model={args.model}",
        *regime.task_keys("data", "train", args.train_problems, task),
        *regime.task_keys("eval_data", "test", RUN_EVAL_PROBLEMS, task),
        f"max_steps={args.steps}",
        f"learning_rate={lr}",
        *regime.sampling_keys(task),
        f"seed={seed}",
        "save_steps=1",
        "lora.enabled=true",
        "resume=last",
        f"prompts_per_step={rows if distill else args.prompts_per_step}",
        f"output_dir={args.output_root / 'train' / run_name(name, seed, lr)}",
    ]  # eval_data: train.py's own final evaluation, kept tiny: the bench evaluates every model itself
    if not distill:
        keys += [f"num_generations={args.group_size}", f"rewards=[{reward(args)}]"]
    if recipe != "rl_full":
        keys += [
            "compression.method=gkv",
            f"compression.budget={args.train_budget}",
            f"compression.window={args.window}",
            f"compression.interval={args.interval}",
        ]
    if recipe == "distill":
        keys.append(f"distill.traces={teacher_traces(args) if make_traces else TRACES.format(root=args.output_root)}")
    keys += task_settings(args)["train_keys"]
    own = [*args.train_keys, *variant_overrides(name, args)]  # a later key replaces an earlier one of its name
    replaced = {o.split("=", 1)[0]: o for o in own}
    return [k for k in keys if k.split("=", 1)[0] not in replaced] + list(replaced.values())


def teacher_traces(args) -> Path:
    """Offline distillation's data: the full-cache initial model's correct completions of train-split problems."""
    path = Path(TRACES.format(root=args.output_root))
    if not path.is_file():
        partial = path.with_suffix(".partial")
        task = regime_args(args)
        regime.run(
            [
                *regime.COMMAND,
                "traces",
                f"model={args.model}",
                *regime.task_keys("data", "train", args.trace_problems, task),
                f"num_generations={args.group_size}",
                *regime.sampling_keys(task),
                f"seed={TRACE_SEED}",
                f"output={partial}",
                *(["keep_incorrect=true"] if args.quick else []),
            ],
            log,
        )
        partial.rename(path)
    return path


def run_job(job: Job, args) -> None:
    task = regime_args(args)
    if job.kind == "train":
        folder = args.output_root / "train" / job.name
        trained = not (folder / "eval.json").is_file()
        if trained:
            regime.run([*regime.COMMAND, "train", *train_keys(job.recipe, job.seed, job.lr, args)], log)
        keep_adapter(folder, args.adapters / job.name, replace=trained, base=args.model)
    elif job.kind == "lr-eval":
        regime.evaluate(
            [f"model={args.model}", f"adapter={adapter_of(run_name(args.lr_recipe, args.lr_seed, job.lr), args)}"],
            "train",
            args.lr_problems,
            args.lr_samples,
            ["gkv"],
            [args.train_budget],
            args.output_root / "lr-eval" / job.name,
            args.lr_eval_seed,
            task,
            full=False,
        )
    else:
        name, condition = job.name.split("@")
        adapter = args.cross_adapters / name if job.kind == "cross" else adapter_of(name, args)
        model = [f"model={args.model}"] + ([] if name == "untrained" else [f"adapter={adapter}"])
        found = parse_condition(condition, args)
        regime.evaluate(
            model,
            "test",
            args.eval_problems,
            args.eval_samples,
            [] if found.method is None else [found.method],
            [args.train_budget if found.budget is None else found.budget],
            args.output_root / job.kind / name / condition,
            found.seed,
            task,
            full=found.method is None,
            compression=[f"compression.window={args.window}", f"compression.interval={args.interval}", *found.keys],
        )


def adapter_of(name: str, args) -> Path:
    """The adapter a run is evaluated with: its training folder's (fp32), or the kept fp16 copy under
    ``--adapters`` when that folder is gone (``samples_of`` marks such a cell)."""
    folder = args.output_root / "train" / name
    return folder if (folder / "adapter_model.safetensors").is_file() else args.adapters / name


def keep_adapter(folder: Path, target: Path, replace: bool, base: str) -> None:
    """The run's LoRA adapter in fp16 (``adapter_model.safetensors`` + its config) under ``target``; one kept
    before stays unless ``replace`` (the run was trained just now). Its config names its base model ``base`` as the
    bench was given it (``--model``; the run's own config holds it resolved, a path of this machine)."""
    import torch
    from safetensors.torch import load_file, save_file

    if (target / "adapter_model.safetensors").is_file() and not replace:
        return
    target.mkdir(parents=True, exist_ok=True)
    weights = load_file(folder / "adapter_model.safetensors")
    save_file({k: v.to(torch.float16) for k, v in weights.items()}, target / "adapter_model.safetensors.partial")
    config = json.loads((folder / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = base
    (target / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (target / "adapter_model.safetensors.partial").rename(target / "adapter_model.safetensors")


def problem_texts(args, split: str, seed: int, n: int) -> set[str]:
    """The prompts of the task's first ``n`` problems of ``split`` at ``seed`` (what ``evaluate.py`` and
    ``train.py`` draw with the bench's task keys)."""
    from gkv_train.problems.data import DataConfig, load_problems
    from gkv_train.problems.tasks import copy_recall_task, count_recall_task, long_recall_task

    if args.task not in TASKS:  # any other task or dataset, drawn as train.py and evaluate.py draw it
        return set(load_problems(DataConfig(**regime.task_fields(split, n, regime_args(args))), seed)["problem"])
    if args.task == "long_recall":
        return set(long_recall_task(n, split, seed, args.sentences, args.number_in_prompt)["problem"])
    if args.task == "count_recall":  # one prompt for every problem: a problem is its note (its code)
        return set(count_recall_task(n, split, seed, args.count_to)["continuation"])
    return set(copy_recall_task(n, split, seed, args.sentences, "places", args.copy_share)["problem"])


def drawn_problems(args) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Every problem set the bench's runs draw besides the fresh ones, by what draws it (texts): the ones that are
    trained on, chosen with or reported, and the ones nothing reads (``train.py``'s own end-of-run evaluation of
    ``RUN_EVAL_PROBLEMS`` test problems at the run's seed). Training draws the train split at its seed, the teacher
    traces at ``TRACE_SEED``, the lr stage's evaluation at ``--lr-eval-seed``, the regime's probe
    (train split) and methods stage (test split) at its seed + 1, the main evaluation the test split at
    ``--eval-seed``."""

    def texts(split: str, seed: int, n: int) -> set[str]:
        return problem_texts(args, split, seed, n)

    runs, regime_seed = {*args.seeds, args.lr_seed}, regime_args(args).seed + 1
    used = {f"training seed {s}": texts("train", s, args.train_problems) for s in runs}
    used["teacher traces"] = texts("train", TRACE_SEED, args.trace_problems)
    used["lr-stage evaluation"] = texts("train", args.lr_eval_seed, args.lr_problems)
    used["probe"] = texts("train", regime_seed, args.probe_problems)
    used["methods stage"] = texts("test", regime_seed, args.methods_problems)
    used["main evaluation"] = texts("test", args.eval_seed, args.eval_problems)
    unread = {f"train.py's own evaluation, seed {s}": texts("test", s, RUN_EVAL_PROBLEMS) for s in runs}
    return used, unread


def check_fresh(args) -> None:
    """SystemExit naming the overlap when a ``--fresh-seeds`` problem set shares a problem with a set the bench
    trains on, chooses with or reports (``drawn_problems``) or with another fresh set; one line on stderr for each
    set nothing reads that it shares problems with."""
    used, unread = drawn_problems(args)
    for seed in args.fresh_seeds:
        fresh = problem_texts(args, "test", seed, args.eval_problems)
        shared = [f"{what} ({len(fresh & drawn)})" for what, drawn in used.items() if fresh & drawn]
        if shared:
            raise SystemExit(
                f"error: --fresh-seeds {seed}: its {len(fresh)} test problems are not fresh, they share problems "
                f"with {', '.join(shared)}: another seed"
            )
        for what, drawn in unread.items():
            if fresh & drawn:
                log(f"--fresh-seeds {seed}: {len(fresh & drawn)} of its problems are also in {what} (never read)")
        used[f"fresh seed {seed}"] = fresh
