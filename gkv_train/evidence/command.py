"""``gkv-train compare``: recipes compared with seeds, problems and paired intervals. By default the evidence for
the central claim: RL-Sparse (the exact record) against Sparse-RL's dense learner with
importance sampling, RL-Full and distillation, all from the same model under the same compressed rollout, on a
decode-regime task the trained models cannot leave (``copy_recall`` with ``data.copy_required=places``: a share
of the story's places copied in order, the number after them), or at reasoning lengths (``--task long_recall``:
a ~1,000-token given story fed through the compressed cache, dozens of compression rounds, then the sampled number;
the GRPO recipes, which train on the sampled tokens only). One JSON line.

Stages (``--stages``; each resumable, every run a ``gkv-train train`` or ``gkv-train evaluate`` folder under
``--output-root``):

1. ``probe``: the untrained model on *train-split* problems (the full cache and every eviction method at
   ``--probe-budgets``), with the regime's three checks (the regime's probe, ``regime.ordering``, on this task).
2. ``methods``: the untrained model's method ordering on ``--methods-problems`` *held-out* problems x
   ``--methods-samples`` (every eviction method, the G-KV forms, S4R at equal memory; ``bench_decode_regime.py``'s
   methods stage, on this task; a call cut short keeps the rows it published).
3. ``lr``: ``--lr-recipe`` at ``--lr-seed`` (0) with each of ``--lrs``, each model evaluated on ``--lr-problems``
   *train-split* problems (another problem stream than training's) under the training compression; the chosen
   rate (highest pass@1, then score) applies to every recipe. The run at the chosen rate is that recipe's run at
   that seed.
4. ``train``: every recipe of ``--recipes`` with every seed of ``--seeds`` (the distillation recipes with the
   first ``--distill-seeds``): the same steps, learning rate, LoRA, prompts per step (a seed draws the problems and
   their order: every recipe sees the same prompts at the same seed) and GRPO group size. Each finished run's
   LoRA adapter is kept in fp16 under ``--adapters`` (a few MB each). An ablation is a ``--variant``: a recipe
   with ``train.py`` overrides of its own under a name of its own, listed in ``--recipes`` like the others.
5. ``eval``: the untrained model and every trained one on the same ``--eval-problems`` held-out problems x
   ``--eval-samples`` (evaluation seed ``--eval-seed``), with the full cache and under the training method at every
   budget of ``--eval-budgets``; with ``--fresh-seeds``, again under the training method at the training budget on
   as many test problems of each fresh seed's stream (condition ``gkv-b<budget>-seed<s>``): a confirmation on
   problems no choice was made on. Before any such evaluation the bench checks that those problems share none with
   any problem set it draws (training, traces, the lr stage, probe, methods, the main evaluation): an error if so.
6. ``cross``: the models trained on the other task (``--cross-adapters``: that bench's kept fp16 adapters, one
   folder per run) on this task's main evaluation problems, with the full cache and at this task's training
   budget, each recipe against this task's untrained model (paired by problem): does a gain carry from one task
   to the other? (the results' ``cross`` section, table view ``cross``).
7. ``report``: the results' training section and figures rebuilt from the finished folders and the results file,
   nothing run (after a change to how they are summarized; the train and eval stages publish the same after every
   job).

Several processes may run the same command at once (one thread each): each takes the next job no other live
process holds (a lock per job: ``gkv_train.evidence.jobs``) whose inputs are done, so two processes share the work;
the results file (``--results``) is rebuilt from every finished folder and what it already held after each job,
under a lock. The results file is the comparison's memory: on a new machine (an empty ``--output-root``) a run it holds,
with its adapter under ``--adapters``, is neither run again nor dropped, and a later evaluation of it loads that
fp16 adapter (its cell says ``fp16_adapter``); a results file made with other settings is an error before any
work. Tables and figures: ``tables(view, result)`` (``scripts/render_docs.py``) and ``--figures``.

    OMP_NUM_THREADS=1 gkv-train compare &     # twice: two workers (python scripts/bench_rl_evidence.py: the same)
    gkv-train compare --quick                 # every stage, a tiny random model (a test runs it)
    OMP_NUM_THREADS=1 gkv-train compare --task long_recall --train-budget 128 --eval-budgets 128 \\
        --output-root outputs/rl_evidence_long_recall \\
        --results results/bench_rl_evidence_long_recall.json --adapters results/rl_evidence_long_recall &
"""

from __future__ import annotations

import argparse
import fcntl
import json
import time

from gkv_train.evidence import regime
from gkv_train.evidence.arguments import add_run_arguments, add_task_arguments, check_arguments, task_defaults
from gkv_train.evidence.design import s4r_length
from gkv_train.evidence.methods_stage import stage_methods
from gkv_train.evidence.plan import every_job, is_done, work
from gkv_train.evidence.published import chosen_lr, published, resolved
from gkv_train.evidence.runs import regime_args
from gkv_train.evidence.summary import collect
from gkv_train.evidence.tables import figures
from gkv_train.jsonio import dumps, write_atomically
from gkv_train.provenance import origin


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with the task's defaults filled in (``--quick``: tiny sizes) and checked as a whole."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_task_arguments(parser.add_argument)
    add_run_arguments(parser.add_argument)
    args = parser.parse_args(argv)
    task_defaults(args, parser)
    check_arguments(args, parser)
    return args


def probe_stage(args) -> dict:
    """The probe's section: the untrained model's ordering of the eviction methods on the train split, with the
    check that each loses at least ``--min-gap`` at the training budget."""
    probe = regime_args(args, ["--budgets", *map(str, args.probe_budgets)])
    probe.methods = args.probe_methods or regime.EVICTION
    section = regime.ordering("probe", "train", args.probe_problems, args.probe_samples, args.output_root, probe)
    at_budget = [
        by[str(args.train_budget)]["gap"] for by in section["table"]["methods"].values() if str(args.train_budget) in by
    ]
    section["checks"]["every_gap_at_training_budget_at_least"] = [
        args.min_gap,
        bool(at_budget) and min(at_budget) >= args.min_gap,
    ]
    section["train_budget"] = args.train_budget
    return section


def methods_stage(args, publish_rows) -> dict:
    """The methods stage's section (``publish_rows``: called with the section as its rows arrive)."""
    ordering = regime_args(
        args,
        [
            "--budgets",
            *map(str, args.methods_budgets),
            "--methods-problems",
            str(args.methods_problems),
            "--methods-samples",
            str(args.methods_samples),
            "--s4r-length",
            str(s4r_length(args) if not args.quick else 96),
            "--s4r-refresh",
            "0",
        ],
    )
    ordering.results = args.results  # a call cut short keeps the rows it published (same settings)
    return stage_methods(args.output_root, ordering, publish_rows)


def main(argv: list[str] | None = None) -> None:
    """``gkv-train compare ARGS`` (``argv``: the arguments, default the command line's)."""
    args = parse_arguments(argv)
    args.output_root.mkdir(parents=True, exist_ok=True)
    if {"lr", "train", "eval", "cross", "report"} & set(args.stages):  # other settings' results: an error, no work
        before, lr = published(args).get("learning_rate"), chosen_lr(args)
        if before is not None and lr is not None and lr != before:
            raise SystemExit(f"error: {args.results} holds runs at learning rate {before:g}, this call's is {lr:g}")
        if before is not None and lr is None and "lr" not in args.stages:  # its runs would be left out of it
            raise SystemExit(f"error: {args.results} holds runs at learning rate {before:g}: --lr {before:g}")
    start = time.perf_counter()
    where = origin()
    lock_path = args.output_root / "results.lock"

    def publish(stage: str, section: dict) -> None:
        """Replace ``stage``'s section of the results file (under a lock: several workers publish)."""
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            old = json.loads(args.results.read_text()) if args.results.is_file() else {}
            old.setdefault("benchmark", "rl_evidence")
            old[stage] = {**section, **where, "date": time.strftime("%Y-%m-%d")}
            write_atomically(args.results, dumps(old, indent=2))

    def publish_training() -> None:
        section = collect(args)
        # the file holds training when a run of it is trained or swept, or when a call other than a cross-only one
        # trains or names a rate; partial while a job of what it holds is not done
        holds_training = any(v is not None for v in section["lr_sweep"].values())
        holds_training |= any("recipe" in m for m in section["models"].values())
        holds_training |= set(args.stages) != {"cross"} and (
            bool({"lr", "train", "eval"} & set(args.stages)) or section["learning_rate"] is not None
        )
        held = [*(["lr", "train", "eval"] if holds_training else []), *(["cross"] if args.cross_adapters else [])]
        held_jobs = every_job(argparse.Namespace(**{**vars(args), "stages": held}))  # not only this call's stages
        section["partial"] = any(not is_done(j, args) for j in held_jobs) or (
            holds_training and section["learning_rate"] is None
        )
        publish("training", section)
        if any(m.get("curve") for m in section["models"].values()):
            figures(section, args.figures)

    if "probe" in args.stages:
        publish("probe", probe_stage(args))
    if "methods" in args.stages:
        publish("methods", methods_stage(args, lambda s: publish("methods", s)))
    if {"lr", "train", "eval", "cross"} & set(args.stages):
        work(args, publish_training)
    if {"lr", "train", "eval", "cross", "report"} & set(args.stages):
        if "report" in args.stages:  # recorded: what the name of each recipe without a record yet stands for
            known = published(args).get("settings", {}).get("train", {}).get("resolved", {})
            resolved(args, [r for r in args.recipes if r not in known])
        publish_training()
    result = json.loads(args.results.read_text())
    training = result.get("training", {})
    print(
        dumps(
            {
                "benchmark": "rl_evidence",
                "stages": args.stages,
                "seconds": round(time.perf_counter() - start, 1),
                "learning_rate": training.get("learning_rate"),
                "recipes": training.get("recipes"),
                **where,
            }
        ),
        flush=True,
    )
