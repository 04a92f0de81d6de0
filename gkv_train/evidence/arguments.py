"""``gkv-train compare``'s command line: where it writes, the task and its sampling, the stages' sizes, the recipes
and their variants, seeds, learning rates and evaluation conditions; the task's defaults filled in and the
arguments checked against each other before any work (``parser.error``: one line, exit 2)."""

from __future__ import annotations

import re
from fnmatch import fnmatch
from pathlib import Path

from gkv_train.argument_types import (
    count,
    fraction,
    input_folder,
    natural,
    output_file,
    output_folder,
    positive_number,
)
from gkv_train.evidence.design import DISTILL, RECIPES, RESERVED, RULES, STAGES, base_recipe, cross_runs, task_settings
from gkv_train.evidence.regime import EVICTION, add_sampling_arguments
from gkv_train.evidence.runs import regime_args
from gkv_train.training.rewards import import_callable


def add_task_arguments(add) -> None:
    """Where the bench writes, the task, its sampling, and the probe and methods stages (``add``: a parser's
    ``add_argument``)."""
    add("--model", default="smollm2-135m")
    add("--output-root", type=output_folder, default=Path("outputs") / "rl_evidence")
    add("--results", type=output_file, default=Path("results") / "bench_rl_evidence.json")
    add(
        "--adapters",
        type=output_folder,
        default=Path("results") / "rl_evidence",
        help="where each run's fp16 adapter is kept",
    )
    add("--figures", type=output_file, default=Path("results") / "bench_rl_evidence_curves.png")
    add("--stages", nargs="+", default=[s for s in STAGES if s != "cross"], choices=STAGES, help="(all but cross)")
    add("--quick", action="store_true", help="every stage, a tiny random model and sizes (a test runs it)")
    add(
        "--task",
        help="the problems: copy_recall (the default; places required; completions ~120-300 tokens), long_recall (a "
        "~1k-token given story through the compressed cache, then the sampled number; the GRPO recipes), "
        "count_recall (a given note's code after a ~530-token count the model writes; the GRPO recipes, from a base "
        "taught the skill: --model), or any other task or dataset gkv-train takes as data.name (arithmetic, "
        "niah_single, ...: give --max-new-tokens; its train and test splits are read before any work)",
    )
    add(
        "--data-path",
        help="instead of --task, a local file of problems with train and test splits (data.path; {split} in it: "
        "the split's file); give --max-new-tokens",
    )
    add(
        "--reward",
        help="GRPO's reward function by import path (default: the task's; another task's or a file's: the recipes' "
        "gkv_rewards.functions.accuracy)",
    )
    add("--sentences", type=count, help="the task's middle sentences (copy_recall 10, long_recall 80)")
    add("--count-to", type=count, help="count_recall's last number (160)")
    add(
        "--copy-share", type=fraction, help="copy_recall: the share of the places a completion must copy in order (0.4)"
    )
    add("--max-new-tokens", type=count, help="copy_recall 300, long_recall 1040 (its story and the number)")
    add_sampling_arguments(add)
    add("--probe-budgets", nargs="+", type=count, default=[192, 160])
    add("--probe-methods", nargs="+", choices=EVICTION, help="probe: these eviction methods (default: every one)")
    add("--probe-problems", type=count, default=32)
    add("--probe-samples", type=count, default=2)
    add("--methods-budgets", nargs="+", type=count, default=[160])
    add("--methods-problems", type=count, default=128)
    add("--methods-samples", type=count, default=4)
    add("--train-budget", type=count, default=160)


def add_run_arguments(add) -> None:
    """The training, learning-rate, evaluation and cross stages (``add``: a parser's ``add_argument``)."""
    add(
        "--recipes",
        nargs="+",
        help=f"of {', '.join(RECIPES)} and the --variant names (default: every one the task trains, long_recall's "
        "given story the GRPO ones; --quick: rl_sparse sparse_rl)",
    )
    add(
        "--variant",
        nargs="+",
        action="append",
        default=[],
        metavar="NAME RECIPE OVERRIDE",
        help="an ablation: RECIPE with these train.py overrides, trained and reported as NAME (to run it, list NAME "
        "in --recipes), e.g. --variant rl_sparse_noclip rl_sparse rl.overlong_advantage_clip=false",
    )
    add(
        "--train-keys",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="train.py overrides of every run, under the recipes' own names (a variant's own win), e.g. "
        "chunk_given=false to extend runs published before it existed",
    )
    add("--seeds", nargs="+", type=natural, default=[0, 1, 2])
    add("--distill-seeds", type=natural, default=1, help="the distillation recipes run the first this many seeds")
    add("--steps", type=count, default=16)
    add("--prompts-per-step", type=count, default=2)
    add("--group-size", type=count, default=4, help="GRPO samples per prompt (distillation: prompts x this rows)")
    add("--train-problems", type=count, default=256)
    add("--trace-problems", type=count, default=64)
    add("--lr", type=positive_number, help="the learning rate of every recipe (no lr stage)")
    add("--lr-recipe", default="rl_sparse", choices=RECIPES)
    add("--lrs", nargs="+", type=positive_number, default=[1e-4, 3e-4, 1e-3])
    add("--lr-problems", type=count, default=32)
    add("--lr-samples", type=count, default=2)
    add(
        "--lr-seed",
        type=natural,
        default=0,
        help="the lr stage's training seed (its run at the chosen rate is that seed's)",
    )
    add("--lr-eval-seed", type=natural, default=1000, help="the lr stage's train-split problem stream (not training's)")
    add("--eval-problems", type=count, default=64)
    add("--eval-samples", type=count, default=4)
    add("--eval-seed", type=natural, default=0)
    add("--eval-budgets", nargs="+", type=count, default=[160, 128], help="the training budget and tighter ones")
    add(
        "--fresh-seeds",
        nargs="*",
        type=natural,
        default=[],
        help="evaluation seeds of fresh test problems: every model again at the training budget on --eval-problems "
        "problems of each seed's test stream (checked to share none with any set the bench draws)",
    )
    add(
        "--eval-controls",
        nargs="*",
        default=[],
        choices=[r for r in RULES if r != "gkv"],
        help="the training-free rules every model is also evaluated under at the training budget (the eval and cross "
        "stages): keep_prompt (G-KV keeping each prompt), random_attention (Random Attention)",
    )
    add(
        "--cross-adapters",
        type=input_folder,
        help="cross stage: the other task's kept adapters (a folder of <recipe>-s<seed>-lr<rate> folders)",
    )
    add("--cross-recipes", nargs="+", help="cross stage: the other task's recipes to evaluate (default: every one)")
    add("--round-bins", nargs="+", type=natural, help="the rounds table's bins (default: the task's)")
    add("--min-gap", type=fraction, default=0.15, help="probe: every method's loss at the training budget, at least")
    add(
        "--min-full",
        type=fraction,
        help="probe: the full cache's pass@1, at least (copy_recall 0.40, long_recall 0.60)",
    )
    add(
        "--min-rounds",
        type=natural,
        help="probe: decode-time compression rounds, at least (copy_recall 6, long_recall 40)",
    )
    add("--poll", type=positive_number, default=30.0, help="seconds between looks for a job while others hold the rest")


def task_defaults(args, parser) -> None:
    """The task's defaults for what the command line left unset (a task of its own, ``GENERIC``: none but the
    checks'; ``--max-new-tokens`` given); ``--quick``: every size tiny."""
    if args.data_path and args.task is not None:
        parser.error(f"--data-path replaces the task's problems: give it without --task {args.task}")
    if args.task is None and not args.data_path:
        args.task = "copy_recall"
    task = task_settings(args)
    if args.reward is not None:
        try:
            import_callable(args.reward)
        except (ImportError, AttributeError, ValueError) as err:
            parser.error(f"--reward {args.reward}: {err}")
    if task["max_new_tokens"] is None and args.max_new_tokens is None and not args.quick:
        parser.error(f"--max-new-tokens: {args.task or args.data_path} has no default, give one")
    if args.task != "copy_recall" and args.copy_share is not None:
        parser.error(f"--copy-share: copy_recall's, not {args.task}'s")
    if args.task != "long_recall" and not args.number_in_prompt:
        parser.error(f"--number-in-prompt: long_recall's, not {args.task}'s")
    if args.copy_share is None and args.task == "copy_recall":
        args.copy_share = 0.4
    for key in ("sentences", "count_to", "max_new_tokens", "min_full", "min_rounds", "round_bins"):
        if getattr(args, key) is None:
            setattr(args, key, task.get(key))
    if args.recipes is None:
        args.recipes = ["rl_sparse", "sparse_rl"] if args.quick else list(task["recipes"])
    if args.quick:
        args.model, args.max_new_tokens, args.batch_problems, args.sentences, args.interval = "tiny", 24, 2, 2, 8
        if args.task == "long_recall":  # the given story (the tiny tokenizer: ~190 tokens at 2 sentences), the number
            args.max_new_tokens = 224
        if args.task == "count_recall":  # the note (~25 tiny tokens), a count to 3 and the code
            args.count_to, args.max_new_tokens = 3, 48
        args.probe_budgets, args.probe_problems, args.probe_samples = [24], 2, 2
        args.methods_budgets, args.methods_problems, args.methods_samples = [24], 2, 1
        args.train_budget, args.steps, args.prompts_per_step, args.group_size = 24, 1, 1, 2
        args.train_problems, args.trace_problems, args.lr_problems, args.lr_samples = 4, 2, 2, 1
        args.eval_problems, args.eval_samples, args.poll, args.round_bins = 2, 1, 0.5, [0, 1]
        if args.lrs == parser.get_default("lrs"):
            args.lrs = [1e-4, 1e-3]
        if args.eval_budgets == parser.get_default("eval_budgets"):
            args.eval_budgets = [24]
        if args.seeds == parser.get_default("seeds"):
            args.seeds = [0, 1]


def check_arguments(args, parser) -> None:
    """The arguments against each other (``parser.error`` names the problem); ``args.variants`` parsed."""
    if args.train_budget not in args.eval_budgets:
        parser.error(f"--eval-budgets {args.eval_budgets} must include the training budget {args.train_budget}")
    args.variants = {}
    for name, *rest in args.variant:
        if not re.fullmatch(r"[a-z0-9_]+", name) or name in (*RECIPES, "untrained") or name in args.variants:
            parser.error(f"--variant {name}: a new name of lower-case letters, digits and _ (not a recipe's)")
        if not rest or rest[0] not in RECIPES or not all("=" in o for o in rest[1:]):
            parser.error(f"--variant {name} {' '.join(rest)}: a recipe ({', '.join(RECIPES)}) then KEY=VALUE overrides")
        reserved = [o for o in rest[1:] if any(fnmatch(o.split("=", 1)[0].lstrip("+~"), key) for key in RESERVED)]
        if reserved:
            parser.error(f"--variant {name}: {' '.join(reserved)} would change the run the bench keeps track of")
        args.variants[name] = (rest[0], rest[1:])
    if not all("=" in o for o in args.train_keys):
        parser.error(f"--train-keys {' '.join(args.train_keys)}: KEY=VALUE overrides")
    reserved = [o for o in args.train_keys if any(fnmatch(o.split("=", 1)[0].lstrip("+~"), k) for k in RESERVED)]
    if reserved:
        parser.error(f"--train-keys: {' '.join(reserved)} would change the runs the bench keeps track of")
    if "cross" in args.stages and (args.cross_adapters is None or not cross_runs(args)):
        parser.error(
            f"--stages cross: --cross-adapters must name a folder of kept adapters (<recipe>-s<seed>-lr<rate>"
            f"{' of --cross-recipes' if args.cross_recipes else ''}), got {args.cross_adapters}"
        )
    unknown = [r for r in args.recipes if r not in RECIPES and r not in args.variants]
    if unknown:
        parser.error(f"--recipes {' '.join(unknown)}: neither a recipe ({', '.join(RECIPES)}) nor a --variant name")
    regime_args(args)  # the task's problems read for both splits (``regime.data_problem``): an error names them
    distilled = [r for r in args.recipes if base_recipe(r, args) in DISTILL]
    if args.task in ("long_recall", "count_recall") and distilled:  # train_config refuses it too, once the run starts
        parser.error(
            f"--task {args.task}: its completions begin with given text, the GRPO recipes only, not "
            f"{' '.join(distilled)}"
        )
