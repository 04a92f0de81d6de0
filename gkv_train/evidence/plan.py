"""The jobs of ``gkv-train compare`` and the loop that takes them: every job of the asked stages in the order they
are taken, what each needs first, and workers that share them (each takes the next job whose inputs are done and
that no live process holds: ``gkv_train.evidence.jobs``)."""

from __future__ import annotations

import time
from pathlib import Path

from gkv_train.evidence import jobs
from gkv_train.evidence.design import DISTILL, Job, base_recipe, conditions, controls, cross_runs, lr_name, run_name
from gkv_train.evidence.published import check_resolved, chosen_lr, published, published_done
from gkv_train.evidence.runs import check_fresh, run_job


def is_done(job: Job, args) -> bool:
    """Finished here (its marker under ``--output-root``) or published (``published_done``): a run whose folders are
    gone (another machine, a cleaned output root) is not run again. The published cells of a run trained here are
    another training's: not counted."""
    if jobs.is_done(args.output_root, job.key):
        return True
    return job.key in published_done(args) and not (job.kind == "eval" and trained_here(job.name.split("@")[0], args))


def trained_here(name: str, args) -> bool:
    return jobs.is_done(args.output_root, Job("train", name).key)


def training_runs(args, lr: float) -> list[tuple[str, int]]:
    """(recipe, seed) of every training run, seed by seed (so that every recipe has its first seed early)."""
    return [
        (recipe, seed)
        for i, seed in enumerate(args.seeds)
        for recipe in args.recipes
        if base_recipe(recipe, args) not in DISTILL or i < args.distill_seeds
    ]


def every_job(args) -> list[Job]:
    """Every job of the asked stages, in the order they are taken: the lr stage; the untrained model's evaluations;
    each training run followed by its evaluations at the training budget and with the full cache (so that results
    arrive run by run); the other budgets' evaluations last."""
    found = []
    stages = set(args.stages) | ({"lr", "train", "eval"} if "report" in args.stages else set())  # report: all
    if "lr" in stages and args.lr is None:
        for lr in args.lrs:
            train = Job(
                "train", run_name(args.lr_recipe, args.lr_seed, lr), recipe=args.lr_recipe, seed=args.lr_seed, lr=lr
            )
            found += [train, Job("lr-eval", lr_name(lr), needs=[train.key], lr=lr)]
    first = [f"gkv-b{args.train_budget}", "full", *controls(args)]
    cross = []  # the other task's models: they need no learning rate of this task's
    if "cross" in stages and args.cross_adapters is not None:
        cross = [Job("eval", f"untrained@{c}") for c in first]
        cross += [Job("cross", f"{run}@{c}") for c in first for run in cross_runs(args)]
    lr = chosen_lr(args)
    if lr is None:
        return found + cross
    evaluate = "eval" in stages
    if evaluate:
        found += [Job("eval", f"untrained@{c}") for c in first]
    trained = []
    for recipe, seed in training_runs(args, lr):
        train = Job("train", run_name(recipe, seed, lr), recipe=recipe, seed=seed, lr=lr)
        trained.append(train)
        if "train" in stages and train.key not in {j.key for j in found}:
            found.append(train)
        if evaluate:
            found += [Job("eval", f"{train.name}@{c}", needs=[train.key]) for c in first]
    if evaluate:
        for c in (c for c in conditions(args) if c not in first):  # condition by condition: each fills in turn
            found += [Job("eval", f"untrained@{c}")]
            found += [Job("eval", f"{t.name}@{c}", needs=[t.key]) for t in trained]
    return found + [j for j in cross if j.key not in {k.key for k in found}]


def work(args, publish) -> None:
    """Take jobs until every one is done: the next one whose inputs are done and that no live process holds; wait
    while only held or blocked ones remain."""
    recorded = published(args).get("cross", {}).get("adapters")
    if "cross" in args.stages and recorded and Path(recorded).resolve() != args.cross_adapters.resolve():
        raise SystemExit(
            f"error: {args.results} holds the cross cells of the models under {recorded}, not {args.cross_adapters}: "
            "another --results"
        )
    if chosen_lr(args) is None and "lr" not in args.stages and {"train", "eval"} & set(args.stages):
        raise SystemExit(
            "error: the train and eval stages need a learning rate: --lr, or the lr stage (its results "
            f"under {args.output_root / 'lr-eval'})"
        )
    if any(j.kind == "train" and not is_done(j, args) for j in every_job(args)):
        check_resolved(args)  # before any training: what each recipe's name will mean
    fresh = set(conditions(args)) - set(conditions(args, fresh=False))
    if any(j.kind == "eval" and j.name.split("@")[1] in fresh and not is_done(j, args) for j in every_job(args)):
        check_fresh(args)  # before any evaluation on them: fresh problems are no set the bench draws otherwise
    while True:
        todo = [j for j in every_job(args) if not is_done(j, args)]
        if not todo:
            return
        ready = [j for j in todo if all(is_done(Job(*n.split("/", 1)), args) for n in j.needs)]
        taken = next((j for j in ready if jobs.claim(args.output_root, j.key)), None)
        if taken is None:
            time.sleep(args.poll)
            continue
        try:
            if not is_done(taken, args):  # another worker may have finished it between the list and the claim
                run_job(taken, args)
                jobs.mark_done(args.output_root, taken.key)
        finally:
            jobs.release(args.output_root, taken.key)
        publish()
