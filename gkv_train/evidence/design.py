"""What ``gkv-train compare`` compares and how it names it: the stages, the recipes, the built-in tasks' settings,
a run's and a condition's names, and the settings a results file records (its identity: ``published``)."""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import NamedTuple

STAGES = ("probe", "methods", "lr", "train", "eval", "cross", "report")
# keys a --variant may not change: what the bench keeps track of runs by, and the problems (every recipe trains
# and is evaluated on the same ones, which check_fresh knows)
RESERVED = ("recipe", "model", "seed", "output_dir", "resume", "save_steps", "data.*", "eval_data.*")
RECIPES = ("rl_sparse", "sparse_rl", "rl_full", "distill", "distill_onpolicy")
DISTILL = ("distill", "distill_onpolicy")
RUN_KEYS = ("seed", "output_dir", "learning_rate", "distill.traces")  # a run's own (the rate: checked by main)
TRACES = "{root}/train/teacher_traces.jsonl"  # the traces the bench generates (settings: trace_problems)
TRACE_SEED = 0  # the teacher traces' problem stream (train split)
RUN_EVAL_PROBLEMS = 2  # train.py's own end-of-run evaluation: test problems at the run's seed, never read here
REWARD = "gkv_rewards.functions.copy_score"  # GRPO's reward: the share of places copied when the number is right
# per task: the defaults of --sentences, --max-new-tokens, the probe's checks (full-cache pass@1 and decode-time
# compression rounds, at least), the length S4R's memory is matched at in the methods stage (prompt + completion)
# and train.py keys every run of the task takes. long_recall: ~1,000 given tokens,
# then the number (issue 53's regime); its 8 rows of ~1,100 tokens hold ~20 GB of activations for the backward in
# fp32 (a run was killed for memory), so its runs recompute them (the same gradients, more time)
TASKS = {
    "copy_recall": {
        "sentences": 10,
        "max_new_tokens": 300,
        "min_full": 0.40,
        "min_rounds": 6,
        "s4r_length": 500,
        "train_keys": [],
        "recipes": RECIPES,
        "round_bins": [0, 4, 6, 8, 10],
    },
    "long_recall": {
        "sentences": 80,
        "max_new_tokens": 1040,
        "min_full": 0.60,
        "min_rounds": 40,
        "s4r_length": 1100,
        "train_keys": ["gradient_checkpointing=true"],
        "recipes": tuple(r for r in RECIPES if r not in DISTILL),  # a given story: distillation refuses it
        "round_bins": [0, 60, 64],  # stories of 57-59 and 62-63 rounds; 64: the length limit
    },
    # count_recall: a ~12-token given note, then ~530 tokens the model writes (counting to 160) and the code; the
    # recipes start from a base taught the skill (--model); reward: half for the count, half for the code after it
    "count_recall": {
        "count_to": 160,
        "max_new_tokens": 640,
        "min_full": 0.80,
        "min_rounds": 30,
        "s4r_length": 620,
        "train_keys": [],
        "recipes": tuple(r for r in RECIPES if r not in DISTILL),  # a given note: the GRPO recipes
        "round_bins": [0, 30, 34, 40],  # a full count ends in round 33-34; 40: the length limit
        "reward": "gkv_rewards.functions.staged_score",
    },
}

# any other task or dataset (``--task NAME``: a data.name gkv-train takes; ``--data-path FILE``): no size, no
# built-in checks, --max-new-tokens given; every recipe; GRPO's reward the recipes' own (the answer checked)
GENERIC = {
    "max_new_tokens": None,
    "min_full": 0.0,
    "min_rounds": 0,
    "s4r_length": None,  # the completion's length + 256 (``s4r_length``)
    "train_keys": [],
    "recipes": RECIPES,
    "round_bins": [0],
    "reward": "gkv_rewards.functions.accuracy",
}


def task_settings(args) -> dict:
    """The task's defaults: a built-in task's (``TASKS``), else ``GENERIC``."""
    return TASKS.get(args.task, GENERIC)


def s4r_length(args) -> int:
    """The length S4R's memory is matched at in the methods stage: the task's, else the completion's + 256."""
    return task_settings(args)["s4r_length"] or args.max_new_tokens + 256


def log(message: str) -> None:
    print(f"[rl_evidence {time.strftime('%H:%M:%S')} pid {os.getpid()}] {message}", file=sys.stderr, flush=True)


def lr_name(lr: float) -> str:
    return f"{lr:g}"


def run_name(recipe: str, seed: int, lr: float) -> str:
    return f"{recipe}-s{seed}-lr{lr_name(lr)}"


def base_recipe(name: str, args) -> str:
    """The ``train.py`` recipe of a ``--recipes`` entry: itself, or the recipe a ``--variant`` of that name
    changes."""
    return args.variants[name][0] if name in args.variants else name


def variant_overrides(name: str, args) -> list[str]:
    """The ``train.py`` overrides a ``--variant`` adds to its recipe's run (each replaces the bench's value of
    its key); none for a recipe."""
    return list(args.variants[name][1]) if name in args.variants else []


def reward(args) -> str:
    """GRPO's reward on this task: ``--reward``, else the task's (``copy_score`` unless it names its own)."""
    return args.reward or task_settings(args).get("reward", REWARD)


@dataclass
class Job:
    """One unit of work: ``kind`` (train, lr-eval, eval), its name (a folder under ``output_root``), the names of
    the jobs it needs first, and how to run it."""

    kind: str
    name: str
    needs: list[str] = field(default_factory=list)
    recipe: str | None = None
    seed: int | None = None
    lr: float | None = None

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.name}"


def cross_runs(args) -> list[str]:
    """The other task's runs under ``--cross-adapters`` (of ``--cross-recipes``), by recipe then seed."""
    if args.cross_adapters is None or not args.cross_adapters.is_dir():
        return []
    found = []
    for folder in args.cross_adapters.iterdir():
        parsed = re.fullmatch(r"([a-z0-9_]+)-s(\d+)-lr(.+)", folder.name)
        if parsed and (folder / "adapter_model.safetensors").is_file():
            if args.cross_recipes is None or parsed[1] in args.cross_recipes:
                found.append((parsed[1], int(parsed[2]), folder.name))
    return [name for *_, name in sorted(found)]


def conditions(args, fresh: bool = True) -> list[str]:
    """The evaluation conditions, in table order: ``full``, ``gkv-b<budget>`` (each of ``--eval-budgets``, on the
    main evaluation's problems), with ``--eval-controls`` the training-free rules at the training budget
    (``controls``), ``gkv-b<training budget>-seed<s>`` (each of ``--fresh-seeds``, unless ``fresh`` is false: on
    fresh problems). ``parse_condition`` reads one back."""
    main = [f"gkv-b{b}" for b in args.eval_budgets]
    seeds = args.fresh_seeds if fresh else []
    at_train = main.index(f"gkv-b{args.train_budget}") + 1
    fresh_cells = [f"gkv-b{args.train_budget}-seed{s}" for s in seeds]
    return ["full", *main[:at_train], *controls(args), *fresh_cells, *main[at_train:]]


def controls(args) -> list[str]:
    """The rules of ``--eval-controls`` at the training budget, the bench's window and interval: G-KV keeping each
    prompt (``keep_prompt-b<budget>``), Random Attention (``random_attention-b<budget>``): the training-free rules a
    trained model is compared with."""
    return [f"{rule}-b{args.train_budget}" for rule in args.eval_controls]


RULES = {  # a condition's prefix -> (evaluate.py's method, its compression keys besides the window and interval)
    "gkv": ("gkv", []),
    "keep_prompt": ("gkv", ["compression.keep_prompt=true"]),
    "random_attention": ("random_attention", []),
}


class Condition(NamedTuple):
    """An evaluation condition read back: ``method`` None and ``budget`` None for the full cache; ``keys`` its
    compression keys besides the window and interval; ``seed`` the problem stream and sampling seed; ``run`` its
    run's name in its ``evaluate.py`` folder (``full`` or ``<method>-b<budget>``)."""

    method: str | None
    budget: int | None
    keys: list[str]
    seed: int
    run: str


def parse_condition(condition: str, args) -> Condition:
    """``condition`` (``full``, ``gkv-b128``, ``keep_prompt-b128``, ``gkv-b128-seed3``) read back."""
    found = re.fullmatch(r"(full|(gkv|keep_prompt|random_attention)-b(\d+))(?:-seed(\d+))?", condition)
    if found is None:
        raise ValueError(f"not an evaluation condition: {condition!r}")
    _, rule, budget, seed = found.groups()
    seed = args.eval_seed if seed is None else int(seed)
    if rule is None:
        return Condition(None, None, [], seed, "full")
    method, keys = RULES[rule]
    return Condition(method, int(budget), keys, seed, f"{method}-b{budget}")


def rounds(length: int, interval: int) -> int:
    """Decode-time compression rounds a completion of ``length`` tokens went through (one after every
    ``interval``-th token, the next token on seeing the result; the prefill's round not counted)."""
    return max(length - 1, 0) // interval


def settings(args) -> dict:
    hidden = {"number_in_prompt": False}  # long_recall with the number only in its story
    return {
        "model": args.model,
        "task": (
            {
                "name": "copy_recall",
                "sentences": args.sentences,
                "copy_required": "places",
                "copy_share": args.copy_share,
            }
            if args.task == "copy_recall"
            else {"name": args.task, "count_to": args.count_to}
            if args.task == "count_recall"
            else {"name": args.task, "sentences": args.sentences, **({} if args.number_in_prompt else hidden)}
            if args.task == "long_recall"
            else {"name": args.task, **({"path": args.data_path} if args.data_path else {})}
        ),
        "window": args.window,
        "interval": args.interval,
        "sampling": {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p},
        "train": {
            "method": "gkv",
            "variants": {name: {"recipe": r, "overrides": o} for name, (r, o) in args.variants.items()},
            **({"train_keys": args.train_keys} if args.train_keys else {}),
            "budget": args.train_budget,
            "steps": args.steps,
            "prompts_per_step": args.prompts_per_step,
            "group_size": args.group_size,
            "lora": True,
            "reward": reward(args),
            **({"task_keys": task_settings(args)["train_keys"]} if task_settings(args)["train_keys"] else {}),
            "train_problems": args.train_problems,
            "seeds": args.seeds,
            "distill_seeds": args.distill_seeds,
            "lr_recipe": args.lr_recipe,
            "lr_seed": args.lr_seed,
            "lr_eval_seed": args.lr_eval_seed,
            "trace_problems": args.trace_problems,
            "lrs": args.lrs,
            "lr_problems": args.lr_problems,
            "lr_samples": args.lr_samples,
        },
        "eval": {
            "split": "test",
            "problems": args.eval_problems,
            "samples": args.eval_samples,
            "seed": args.eval_seed,
            "budgets": args.eval_budgets,
            "fresh_seeds": args.fresh_seeds,
            "batch_problems": args.batch_problems,
            **({"controls": args.eval_controls} if args.eval_controls else {}),
        },
    }
