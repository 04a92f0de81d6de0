"""The results of ``gkv-train compare`` from its finished folders: per sample data of every evaluation, each
recipe's figures over seeds under each condition (hierarchical intervals), the paired and seed-independent
differences between recipes (``gkv_train.stats``), pass@1 by compression rounds, the training curves, and the other
task's models (the cross stage)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from gkv_train.evidence.design import (
    base_recipe,
    conditions,
    controls,
    cross_runs,
    lr_name,
    parse_condition,
    rounds,
    run_name,
    settings,
)
from gkv_train.evidence.plan import Job, is_done, trained_here, training_runs
from gkv_train.evidence.published import chosen_lr, lr_sweep, published
from gkv_train.jsonio import read_jsonl
from gkv_train.problems.tasks import count_recall_restated
from gkv_train.stats import hierarchical_interval, independent_difference, paired_difference


def samples_of(folder: Path, run: str, kept: Path | None = None, count_to: int | None = None) -> dict | None:
    """Per problem (by id, in order): correct (0/1), score, length of each sample of one evaluation run; with
    ``fp16_adapter`` true where the model's adapter was the kept fp16 copy (``kept``), not its training folder's;
    with ``count_to`` (a ``count_recall`` evaluation), ``restated``: how far each completion had counted when it
    first restated the note's code before its count's end (``count_recall_restated``; None: it did not)."""
    path = folder / run / "samples.jsonl"
    summary = json.loads((folder / "summary.json").read_text()) if (folder / "summary.json").is_file() else None
    if not path.is_file() or summary is None or run not in {r["run"] for r in summary["runs"]}:
        return None
    by_problem: dict = {}
    for s in read_jsonl(path):
        by_problem.setdefault(s["problem_id"], []).append(s)
    ids = sorted(by_problem)
    found = {
        "problems": ids,
        "correct": [[int(s["correct"]) for s in by_problem[i]] for i in ids],
        "score": [[round(s["score"], 4) for s in by_problem[i]] for i in ids],
        "length": [[s["length"] for s in by_problem[i]] for i in ids],
    }
    if count_to is not None:
        found["restated"] = [
            [count_recall_restated(s["completion"], str(s["gold"]), count_to) for s in by_problem[i]] for i in ids
        ]
    if kept is not None and (summary.get("adapter") or {}).get("model") == str(kept):
        found["fp16_adapter"] = True
    return found


def counted(args) -> int | None:
    """The count of a ``count_recall`` comparison (its cells say where each completion restated the code)."""
    return args.count_to if args.task == "count_recall" else None


def per_problem(cell: dict, what: str = "correct") -> list[float]:
    return [sum(v) / len(v) for v in cell[what]]


def summarize_recipe(cells: list[dict], interval: int, limit: int) -> dict:
    """One recipe's figures under one condition, over its seeds (``cells``: one evaluation per seed). Per seed also
    the share of completions that ran to ``limit`` (``max_new_tokens``) and the pass@1 of those that stopped before
    it: a policy that no longer stops shows there before its pass@1 explains why."""
    seeds = [per_problem(c) for c in cells]
    lengths = [x for c in cells for v in c["length"] for x in v]
    at_limit, stopped = [], []
    for c in cells:
        pairs = [(ok, n) for oks, lens in zip(c["correct"], c["length"]) for ok, n in zip(oks, lens)]
        finished = [ok for ok, n in pairs if n < limit]
        at_limit.append(1 - len(finished) / len(pairs))
        stopped.append(sum(finished) / len(finished) if finished else None)
    return {
        "seeds": len(cells),
        "pass@1": sum(sum(s) / len(s) for s in seeds) / len(seeds),
        "pass@1_ci95": hierarchical_interval(seeds),
        "per_seed": [sum(s) / len(s) for s in seeds],
        "score": sum(sum(per_problem(c, "score")) / len(c["score"]) for c in cells) / len(cells),
        "mean_length": sum(lengths) / len(lengths),
        "mean_rounds": sum(rounds(x, interval) for x in lengths) / len(lengths),
        "at_limit_per_seed": at_limit,
        "pass@1_stopped_per_seed": stopped,
        **(restating(cells) if all("restated" in c for c in cells) else {}),
    }


def restating(cells: list[dict]) -> dict:
    """``count_recall``'s writing, over seeds: the share of completions that restate the note's code before their
    count ends (per seed, and over seeds and problems with its interval), and how far they had counted when they
    first did (the median over those completions, as a share of the count; None when none does)."""
    seeds = [[sum(x is not None for x in v) / len(v) for v in c["restated"]] for c in cells]
    reached = [x for c in cells for v in c["restated"] for x in v if x is not None]
    return {
        "restated": sum(sum(s) / len(s) for s in seeds) / len(seeds),
        "restated_ci95": hierarchical_interval(seeds),
        "restated_per_seed": [sum(s) / len(s) for s in seeds],
        "restated_at_median": statistics.median(reached) if reached else None,
    }


def compare(mine: dict, theirs: dict) -> dict:
    """``mine`` minus ``theirs`` (each: seed -> evaluation under one condition; the untrained model's one
    evaluation, under key None, pairs with every seed), per problem: ``gkv_train.stats.paired_difference`` over the
    seeds both have and ``independent_difference`` over every seed of each; {} when they share no seed."""
    paired_with = dict.fromkeys(mine, theirs[None]) if None in theirs else theirs
    common = sorted(set(mine) & set(paired_with))
    if not common:
        return {}
    return {
        **paired_difference([per_problem(mine[s]) for s in common], [per_problem(paired_with[s]) for s in common]),
        **independent_difference([per_problem(x) for x in mine.values()], [per_problem(y) for y in theirs.values()]),
    }


def by_rounds(cells: list[dict], interval: int, bins: list[int]) -> list[dict]:
    """pass@1 of the samples whose completion went through [bins[i], bins[i+1]) decode-time rounds (the last bin
    open), pooled over seeds: a gain that survives at equal length."""
    found = []
    for i, low in enumerate(bins):
        high = bins[i + 1] if i + 1 < len(bins) else None
        picked = [
            ok
            for c in cells
            for oks, lens in zip(c["correct"], c["length"])
            for ok, n in zip(oks, lens)
            if low <= rounds(n, interval) and (high is None or rounds(n, interval) < high)
        ]
        found.append(
            {"rounds": [low, high], "samples": len(picked), "pass@1": sum(picked) / len(picked) if picked else None}
        )
    return found


def curve(folder: Path) -> dict:
    """Per-step figures of one run: the reward of the step's rollouts, the mismatch telemetry, the share of
    completion tokens left out of the loss (Sparse-RL's rejection), the rollouts' mean length, the share of them
    cut at the length limit, the policy's entropy, and the step's wall-clock seconds (``step_time``) and the part
    of them spent sampling (``rollout/seconds``). A step logged twice (a run resumed) counts once, its last row."""
    keys = (
        "reward",
        "mismatch/agreement_p5",
        "mismatch/ratio_p1",
        "mismatch/ratio_p99",
        "mismatch/mean_abs",
        "sampling/rollout_tokens_dropped",
        "completions/mean_length",
        "completions/clipped_ratio",
        "entropy",
        "step_time",
        "rollout/seconds",
    )
    rows = [r for r in read_jsonl(folder / "metrics.jsonl") if "mismatch/max_abs" in r or "loss" in r]
    steps = list({r["step"]: r for r in rows}.values())
    return {k: [[r["step"], r[k]] for r in steps if k in r] for k in keys}


def collect(args) -> dict:
    """The results section built from every finished folder and, for what no folder here holds, the results file
    (``published``): runs this call does not list stay, and so do their variants' definitions."""
    lr = chosen_lr(args)
    sweep = lr_sweep(args)
    if args.lr is not None:  # --lr: the sweep's finished runs, if any, stay in the results
        sweep = {lr: r for lr, r in sweep.items() if r is not None}
    section: dict = {"settings": settings(args), "lr_sweep": sweep, "learning_rate": lr, "models": {}}
    if lr is None:  # the untrained model's cells: this folder's, else the results file's (another machine's)
        before = published(args).get("models", {}).get("untrained", {}).get("cells", {})
        folder = args.output_root / "eval" / "untrained"
        untrained = {
            c: samples_of(folder / c, parse_condition(c, args).run, None, counted(args)) or before.get(c)
            for c in conditions(args)
        }
        untrained.update({c: v for c, v in before.items() if c not in untrained})  # other budgets stay
        if any(untrained.values()):  # the cross stage's comparison needs no learning rate
            section["models"]["untrained"] = {"cells": untrained}
        section["cross"] = cross_section(section, args)
        return section
    before = published(args).get("models", {})
    names = ["untrained", *(run_name(r, s, lr) for r, s in training_runs(args, lr))]
    # runs at this rate that this call does not list (other seeds, recipes) stay, read again from their folders
    names += [n for n in before if n not in names and n.endswith(f"-lr{lr_name(lr)}")]
    for name in names:
        old = {} if trained_here(name, args) else before.get(name, {})
        kept = None if name == "untrained" else args.adapters / name
        cells = {
            c: samples_of(args.output_root / "eval" / name / c, parse_condition(c, args).run, kept, counted(args))
            or old.get("cells", {}).get(c)
            for c in conditions(args)
        }
        cells.update({c: v for c, v in old.get("cells", {}).items() if c not in cells})  # other budgets stay
        trained = name != "untrained" and is_done(Job("train", name), args)
        if all(v is None for v in cells.values()) and not trained and name not in before:
            continue
        model: dict = {"cells": cells}
        if name != "untrained":
            recipe, seed = name.split("-s")[0], int(name.split("-s")[1].split("-")[0])
            metrics = args.output_root / "train" / name / "metrics.jsonl"
            model.update(
                recipe=recipe, seed=seed, curve=curve(metrics.parent) if metrics.is_file() else old.get("curve", {})
            )
        section["models"][name] = model
    before_train = published(args).get("settings", {}).get("train", {})
    train = section["settings"]["train"]
    train["variants"] = {**before_train.get("variants", {}), **train["variants"]}
    train["resolved"] = {**before_train.get("resolved", {}), **(getattr(args, "_resolved", None) or {})}
    section["recipes"] = recipe_table(section, args)
    section["differences"] = differences(section, args)
    section["cross"] = cross_section(section, args)
    return section


def cross_section(section: dict, args) -> dict:
    """The other task's models on this task (the cross stage): per run its cells; per condition (the full cache,
    this task's training budget) per recipe its figures over seeds and its paired difference against this task's
    untrained model. What the results file held is kept for runs not evaluated here."""
    before = published(args).get("cross", {})
    first = ["full", f"gkv-b{args.train_budget}", *controls(args)]
    models = dict(before.get("models", {}))
    for name in cross_runs(args):
        cells = {
            c: samples_of(args.output_root / "cross" / name / c, parse_condition(c, args).run, None, counted(args))
            for c in first
        }
        cells = {c: v or models.get(name, {}).get("cells", {}).get(c) for c, v in cells.items()}
        if any(cells.values()):
            recipe, seed = name.split("-s")[0], int(name.split("-s")[1].split("-")[0])
            models[name] = {"recipe": recipe, "seed": seed, "cells": cells}
    if not models:
        return {}
    untrained = section["models"].get("untrained", {}).get("cells", {})
    recipes = list(dict.fromkeys(m["recipe"] for m in models.values()))
    table = {}
    for condition in first:
        rows = {}
        if untrained.get(condition):  # this task's untrained model, the row each difference is taken against
            rows["untrained"] = summarize_recipe([untrained[condition]], args.interval, args.max_new_tokens)
        for recipe in recipes:
            cells = {
                m["seed"]: m["cells"][condition]
                for m in sorted(models.values(), key=lambda m: m["seed"])
                if m["recipe"] == recipe and m["cells"].get(condition)
            }
            if not cells:
                continue
            rows[recipe] = summarize_recipe(list(cells.values()), args.interval, args.max_new_tokens)
            if untrained.get(condition):
                rows[recipe]["minus_untrained"] = compare(cells, {None: untrained[condition]})
        table[condition] = rows
    adapters = args.cross_adapters or before.get("adapters")
    return {"adapters": str(adapters) if adapters else None, "models": models, "recipes": table}


def recipe_table(section: dict, args) -> dict:
    """Per condition: per recipe (and the untrained model) its figures over seeds, and RL-Sparse's paired
    differences."""
    table = {}
    models = section["models"]
    # RL-Sparse: the recipe itself where it runs, else its first variant (long_recall runs rl_sparse_noclip only)
    reference = (
        "rl_sparse"
        if "rl_sparse" in args.recipes
        else next((r for r in args.recipes if base_recipe(r, args) == "rl_sparse"), "rl_sparse")
    )
    for condition in conditions(args):
        rows = {}
        groups = {
            "untrained": [models["untrained"]["cells"][condition]]
            if "untrained" in models and models["untrained"]["cells"].get(condition)
            else []
        }
        for recipe in args.recipes:
            groups[recipe] = [
                m["cells"][condition]
                for m in sorted((m for m in models.values() if m.get("recipe") == recipe), key=lambda m: m["seed"])
                if m["cells"].get(condition)
            ]
        for name, cells in groups.items():
            if cells:
                rows[name] = summarize_recipe(cells, args.interval, args.max_new_tokens)
                rows[name]["by_rounds"] = by_rounds(cells, args.interval, args.round_bins)
        for name in rows:
            found = paired(models, reference, name, condition) if name != reference else {}
            if found:
                rows[name]["rl_sparse_minus"] = found
        table[condition] = rows
    return table


def cells_by_seed(models: dict, name: str, condition: str) -> dict:
    """A recipe's evaluations under ``condition`` by seed; the untrained model's one evaluation under key None."""
    if name == "untrained":
        found = models.get("untrained", {}).get("cells", {}).get(condition)
        return {None: found} if found else {}
    return {
        m["seed"]: m["cells"][condition]
        for m in models.values()
        if m.get("recipe") == name and m["cells"].get(condition)
    }


def paired(models: dict, first: str, second: str, condition: str) -> dict:
    """``first`` minus ``second`` under ``condition`` (``compare``)."""
    return compare(cells_by_seed(models, first, condition), cells_by_seed(models, second, condition))


def differences(section: dict, args) -> dict:
    """Per condition, every recipe minus every later one (``--recipes`` order, the untrained model last), paired
    as ``paired`` pairs them: which differences an interval separates from 0, not only RL-Sparse's."""
    names = [*args.recipes, "untrained"]
    found = {}
    for condition in conditions(args):
        pairs = {}
        for i, first in enumerate(names):
            for second in names[i + 1 :]:
                d = paired(section["models"], first, second, condition)
                if d:
                    pairs[f"{first} - {second}"] = d
        found[condition] = pairs
    return found
