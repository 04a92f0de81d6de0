"""The training stage of ``bench_decode_regime``: each recipe's ``gkv-train train`` keys (the teacher traces
first for distillation), the training curves and telemetry read back, earlier models reused, and every model
evaluated under the methods of the ordering."""

from __future__ import annotations

import json
from pathlib import Path

from gkv_train.evidence.methods_stage import s4r_keys
from gkv_train.evidence.regime import (
    COMMAND,
    evaluate,
    log,
    row,
    run,
    sampling_keys,
    sampling_settings,
    task_keys,
)
from gkv_train.jsonio import dumps, read_jsonl
from gkv_train.provenance import origin

# name -> (train.py recipe, the rollout's compression method; None: the full cache)
RECIPES = {
    "rl_sparse": ("rl_sparse", "train"),
    "sparse_rl": ("sparse_rl", "train"),
    "rl_full": ("rl_full", None),
    "distill_onpolicy": ("distill_onpolicy", "train"),
    "rl_sparse_snapkv": ("rl_sparse", "snapkv"),
    "rl_sparse_s4r": ("rl_sparse", "s4r"),  # at the persistent memory of the training budget (s4r_keys)
    "distill": ("distill", "train"),
}

TELEMETRY = (
    "mismatch/mean_abs",
    "mismatch/max_abs",
    "mismatch/kl",
    "mismatch/ratio_p1",
    "mismatch/ratio_p5",
    "mismatch/ratio_p50",
    "mismatch/ratio_p95",
    "mismatch/ratio_p99",
    "mismatch/agreement_p5",
)


def method_of(name: str, args) -> str | None:
    method = RECIPES[name][1]
    return args.train_method if method == "train" else method


def train_keys(name: str, root: Path, args) -> list[str]:
    recipe, method = RECIPES[name][0], method_of(name, args)
    distill = recipe.startswith("distill")
    rows = args.prompts_per_step * args.group_size
    keys = [
        f"recipe={recipe}",
        f"model={args.model}",
        *task_keys("data", "train", args.train_problems, args),
        *task_keys("eval_data", "test", 2, args),
        f"max_steps={args.steps}",
        f"learning_rate={args.lr}",
        *sampling_keys(args),
        f"seed={args.seed}",
        f"save_steps={args.save_steps}",
        "lora.enabled=true",
        "resume=last",
        f"prompts_per_step={rows if distill else args.prompts_per_step}",
        f"output_dir={root / 'training' / 'train' / name}",
    ]  # eval_data: train.py's own final evaluation, kept tiny: the bench evaluates every model itself
    if not distill:
        keys.append(f"num_generations={args.group_size}")
    if method == "s4r":
        keys += ["compression.method=s4r", *s4r_keys(args.train_budget, args)]
    elif method is not None:
        keys += [
            f"compression.method={method}",
            f"compression.budget={args.train_budget}",
            f"compression.window={args.window}",
            f"compression.interval={args.interval}",
        ]
    if recipe == "distill":
        keys.append(f"distill.traces={teacher_traces(root, args)}")
    return keys


def teacher_traces(root: Path, args) -> Path:
    """Offline distillation's data: the full-cache teacher's (the initial model's) correct completions of
    training problems (``--quick``: wrong ones too, a random tiny model solves nothing), by generate_traces.py."""
    path = root / "training" / "train" / "teacher_traces.jsonl"
    if not path.is_file():
        partial = path.with_suffix(".partial")
        run(
            [
                *COMMAND,
                "traces",
                f"model={args.model}",
                *task_keys("data", "train", args.trace_problems, args),
                f"num_generations={args.group_size}",
                *sampling_keys(args),
                f"seed={args.seed}",
                f"output={partial}",
                *(["keep_incorrect=true"] if args.quick else []),
            ]
        )
        partial.rename(path)
    return path


def curve(folder: Path) -> dict:
    """Per-step training figures of one run: the reward of the step's rollouts, and the mismatch telemetry
    averaged over steps."""
    steps = [r for r in read_jsonl(folder / "metrics.jsonl") if "mismatch/max_abs" in r]  # every training step's
    return {
        "reward": [[r["step"], r["reward"]] for r in steps if "reward" in r],
        "loss": [[r["step"], r.get("loss")] for r in steps],
        "telemetry": {
            k: sum(r[k] for r in steps) / len(steps) for k in TELEMETRY if steps and all(k in r for r in steps)
        },
        "seconds_per_step": (steps[-1]["time"] - steps[0]["time"]) / max(1, len(steps) - 1) if steps else None,
    }


def training_settings(args) -> dict:
    """What makes two training sections' models comparable: the task, cache, sampling, the training recipe's
    shared figures and the held-out evaluation."""
    return {
        "model": args.model,
        "sentences": args.sentences,
        "copy_required": args.copy_required,
        "window": args.window,
        "interval": args.interval,
        "sampling": sampling_settings(args),
        "train_method": args.train_method,
        "train_budget": args.train_budget,
        "eval_budgets": args.eval_budgets,
        "training": training_figures(args),
        "eval": eval_figures(args),
        "eval_seed": args.seed,
        "s4r_length": args.s4r_length,
    }


def training_figures(args) -> dict:
    return {
        "steps": args.steps,
        "learning_rate": args.lr,
        "lr_search_budget": 1,
        "lora": True,
        "grpo_prompts_per_step": args.prompts_per_step,
        "samples_per_prompt": args.group_size,
        "distill_rows_per_step": args.prompts_per_step * args.group_size,
        "train_problems": args.train_problems,
    }


def eval_figures(args) -> dict:
    return {"split": "test", "problems": args.eval_problems, "samples_per_problem": args.eval_samples}


def earlier_models(results: Path | None, settings: dict, replace: bool = False) -> dict:
    """name -> model row of the training section in ``results`` when it was measured with ``settings``, each
    with where it was measured (``measured``: command, date, commit, machine). A section measured with other
    settings is an error naming them (``replace``: it is replaced instead, as the stage publishes)."""
    if results is None or not results.is_file():
        return {}
    old = json.loads(results.read_text()).get("training")
    if old is None:
        return {}
    settings = json.loads(json.dumps(settings))
    if old.get("settings") != settings:
        if replace:
            log(f"the training section of {results} was measured with other settings: replaced")
            return {}
        differ = sorted(
            k for k in {*settings, *old.get("settings", {})} if settings.get(k) != old.get("settings", {}).get(k)
        )
        raise SystemExit(
            f"error: the training section of {results} was measured with other settings ({', '.join(differ)}):"
            " use the same ones to extend it, another --results file, or --replace-training"
        )
    where = {k: old.get(k) for k in ("command", "date", "commit", "machine")}
    return {name: {**r, "measured": r.get("measured", where)} for name, r in old["models"].items()}


def stage_training(root: Path, args, publish) -> dict:
    """Train every recipe (``train.py``) and evaluate every model (``evaluate.py``); ``publish(section)`` after
    every model. A model already in ``--results`` from a run with the same settings is taken from there: the
    untrained model, and a recipe of ``--recipes`` whose adapter is in this output root (the same run: its
    training curve must match), get the cells they lack evaluated (every method any model has, at every
    budget); any other earlier model keeps its row as measured (its missing cells stay ``-``: retraining it to
    fill them is not this stage's call). The earlier models come first, in their order."""
    settings = training_settings(args)
    earlier = earlier_models(args.results, settings, args.replace_training)
    recipes = list(dict.fromkeys(args.recipes))
    eval_methods = sorted(
        {m for name in recipes if (m := method_of(name, args)) is not None}
        | {args.train_method}
        | {m for r in earlier.values() for m in r["compressed"]}
    )
    models: dict = dict(earlier)  # published with every row from the start: a cut run loses none
    section = {
        "train_method": args.train_method,
        "train_budget": args.train_budget,
        "eval_budgets": args.eval_budgets,
        "eval": eval_figures(args),
        "training": training_figures(args),
        "settings": settings,
        "models": models,
        "partial": True,
    }
    measured = origin()
    for name in [*earlier, *(n for n in ["untrained", *recipes] if n not in earlier)]:
        folder = root / "training" / "train" / name
        found = earlier.get(name)
        trained_here = (folder / "eval.json").is_file()
        if found is not None and name != "untrained" and not (name in recipes and trained_here):
            continue  # its adapter is elsewhere (or not asked for): kept as measured
        if found is not None and name != "untrained" and found.get("curve") != json.loads(dumps(curve(folder))):
            raise SystemExit(
                f"error: {folder} is not the run that {args.results} measured as {name!r} (its training "
                "curve differs): another --output-root, or remove that folder"
            )
        model = [f"model={args.model}"]
        if name != "untrained":
            if not trained_here:
                run([*COMMAND, "train", *train_keys(name, root, args)])
            model.append(f"adapter={folder}")
        row = evaluate_model(name, model, found, eval_methods, root, args)
        if row.pop("added") or found is None:
            row.setdefault("measured", measured)
            if found is not None:  # cells added to an earlier row: where each extension came from
                row["extended"] = [*row.get("extended", []), measured]
        models[name] = row
        publish(section)
    section["partial"] = False
    return section


def evaluate_model(name: str, model: list[str], found: dict | None, eval_methods: list[str], root: Path, args) -> dict:
    """One model's row: the full cache and every method x ``--eval-budgets`` (S4R at each budget's memory), the
    cells of ``found`` (an earlier row of this model) kept, the others evaluated (``added``: some were); a
    trained model's recipe, rollout cache and training curve."""
    out = root / "training" / "eval" / name
    result = json.loads(json.dumps(found)) if found is not None else {"compressed": {}}  # the earlier row untouched
    result["added"] = any(
        str(b) not in result["compressed"].get(m, {}) for m in eval_methods for b in args.eval_budgets
    )
    cells = {m: result["compressed"].setdefault(m, {}) for m in eval_methods}
    missing = {m: [b for b in args.eval_budgets if str(b) not in cells[m]] for m in eval_methods}
    # one evaluate.py call per set of missing budgets of the eviction methods (they share their options), the full
    # cache in the first; S4R one call per budget, at that budget's memory. A run's samples depend on its own
    # settings and seed only, not on the other runs of its call.
    groups: dict[tuple[int, ...], list[str]] = {}
    for method in eval_methods:
        if method != "s4r" and missing[method]:
            groups.setdefault(tuple(missing[method]), []).append(method)
    calls = list(groups.items()) or ([(tuple(args.eval_budgets), [])] if "full" not in result else [])
    for budgets, methods in calls:
        with_full = "full" not in result
        runs = evaluate(
            model,
            "test",
            args.eval_problems,
            args.eval_samples,
            methods,
            list(budgets),
            out,
            args.seed,
            args,
            full=with_full,
        )
        if with_full:
            result["full"] = row(runs["full"], None)
        for method in methods:
            cells[method].update({str(b): row(runs[f"{method}-b{b}"], result["full"]) for b in budgets})
    full = result["full"]
    for b in missing.get("s4r", []):
        runs = evaluate(
            model,
            "test",
            args.eval_problems,
            args.eval_samples,
            ["s4r"],
            [b],
            out / f"s4r-b{b}",
            args.seed,
            args,
            full=False,
            compression=s4r_keys(b, args),
        )
        cells["s4r"][str(b)] = row(runs[f"s4r-b{b}"], full)
    for method in eval_methods:
        result["compressed"][method] = {str(b): cells[method][str(b)] for b in sorted(map(int, cells[method]))}
    if name != "untrained":
        recipe, method = RECIPES[name][0], method_of(name, args)
        result.update(recipe=recipe, rollout=method or "full", curve=curve(root / "training" / "train" / name))
    log(
        f"{name}: full {full['pass@1']:.3f}, "
        + ", ".join(f"{m}-b{b} {c['pass@1']:.3f}" for m, by in result["compressed"].items() for b, c in by.items())
    )
    return result
