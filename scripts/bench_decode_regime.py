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
import json
import time
from pathlib import Path

from gkv_train.argument_types import count, positive_number
from gkv_train.evidence.methods_stage import cell, ordering_table, s4r_keys, stage_methods
from gkv_train.evidence.regime import (
    COMMAND,
    add_arguments,
    check_arguments,
    evaluate,
    log,
    ordering,
    row,
    run,
    sampling_keys,
    sampling_settings,
    task_keys,
)
from gkv_train.jsonio import dumps, read_jsonl, write_atomically
from gkv_train.provenance import origin, provenance

from _common import merge_section, print_json

STAGES = ("probe", "methods", "training")
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
