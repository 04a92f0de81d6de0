"""The configuration of a training run (``train.py``, ``gkv-train train``): ``TrainConfig``, the project's keys
(``TrainOptions``) and every field of TRL's ``GRPOConfig`` under its own name, type and help (``TrlArguments``,
generated from the installed TRL), validated once when built, before any work. Importing this module imports TRL."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from transformers import TrainingArguments

from gkv_rollout.config import CompressionConfig
from gkv_train.config.options import (
    ALGORITHMS,
    LOSS_TYPES,
    PRECISIONS,
    DistillOptions,
    LoraOptions,
    SparseRLOptions,
    check_compile_decode,
    check_range,
    check_recipe,
    check_sampling_keys,
    check_trackers,
)
from gkv_train.config.trl_fields import (
    ENGINE_IGNORES,
    TRL_AT_LEAST,
    TRL_CHOICES,
    check_hub_access,
    trl_arguments,
    trl_fields,
)
from gkv_train.problems.data import LONG_RECALL, DataConfig


@dataclass
class TrainOptions:
    """The keys of a training run that TRL's ``GRPOConfig`` does not have (``TrainConfig`` adds GRPOConfig's own
    fields, with TRL's help).

    recipe: the recipe (recipes/recipe/*.yaml): rl_sparse, rl_full, sparse_rl, distill, distill_onpolicy.
    algorithm: grpo (TRL's GRPOTrainer, ``gkv_train.training.grpo``) or distill (``gkv_train.training.distill``).
    model: a built-in model (smollm2-135m, tiny), a hub name or a local folder / GGUF file.
    data: the training problems.
    eval_data: the held-out problems of the final evaluation (and of eval_steps).
    compression: the rollouts' KV-cache compression (``compression.method=full``: none).
    compile_decode: the rollouts' decode steps as compiled graphs (not with s4r). The rollouts' other sampling
        keys are TRL's fields: num_generations (GRPO's group size), max_completion_length, temperature, top_p.
    prompts_per_step: GRPO: distinct prompts per optimizer step (rows: x num_generations); distillation:
        rows (traces or prompts) per step. Sets TRL's per_device_train_batch_size.
    rewards: reward functions by import path (plain callables, TRL's signature). Naming one imports its module,
        whose code runs: like a trust-remote-code choice, a configuration names code to run.
    rl: what RL-Sparse adds to GRPO (training under the record; importance sampling against the rollout).
    distill: distillation (algorithm=distill).
    precision: fp32 or bf16 (bf16: forwards under autocast, weights kept fp32; under accelerate launch, follows
        its mixed precision when not given). Sets TRL's bf16.
    gradient_checkpointing: recompute activations in the backward (memory for time).
    lora: LoRA adapters instead of training every weight.
    mask_backend: how training forwards attend under the record: auto (flex on CUDA, sdpa elsewhere), flex
        (FlexAttention, block masks from the record) or sdpa (the kept key columns gathered per query chunk; any
        device).
    output_dir: the run's folder (checkpoints, metrics.jsonl, train.log, eval.json).
    report_to: trackers (tensorboard, wandb, mlflow, trackio); a single name is read as a list of one.
    eval_samples: completions per held-out problem in the final evaluation.
    resume: a checkpoint directory of this run (output_dir), or "last" for the newest complete one in output_dir;
        its optimizer and scheduler state come with it, so settings that differ from it are refused.
    resume_other_run: allow resume= to name a checkpoint of another run's folder (its optimizer, scheduler and step
        count continue in this output_dir).
    overwrite: replace a previous run in output_dir (otherwise refused unless resume is given).
    """

    recipe: str = "rl_sparse"
    algorithm: str = "grpo"
    model: str = "smollm2-135m"
    data: DataConfig = field(default_factory=DataConfig)
    eval_data: DataConfig = field(default_factory=lambda: DataConfig(split="test", limit=32))
    compression: CompressionConfig = field(
        default_factory=lambda: CompressionConfig("gkv", budget=64, window=8, interval=16)
    )
    compile_decode: bool = False
    prompts_per_step: int = 2
    rewards: list[str] = field(default_factory=lambda: ["gkv_rewards.functions.accuracy"])
    rl: SparseRLOptions = field(default_factory=SparseRLOptions)
    distill: DistillOptions = field(default_factory=DistillOptions)
    precision: str = "fp32"
    gradient_checkpointing: bool = False
    lora: LoraOptions = field(default_factory=LoraOptions)
    mask_backend: str = "auto"
    output_dir: str = "outputs/rl_sparse"
    report_to: Any = field(default_factory=list)
    eval_samples: int = 1
    resume: str | None = None
    resume_other_run: bool = False
    overwrite: bool = False


TRL_FIELDS = trl_fields({f.name for f in dataclasses.fields(TrainOptions)})
# TRL's sampling fields that distillation reads too (``CompressedDistillationConfig`` declares them)
DISTILL_SAMPLING = ("max_completion_length", "temperature", "top_p")
GRPO_ONLY = tuple(
    sorted(set(TRL_FIELDS) - {f.name for f in dataclasses.fields(TrainingArguments)} - set(DISTILL_SAMPLING))
)
TrlArguments = trl_arguments(TRL_FIELDS)


@dataclass
class TrainConfig(TrainOptions, TrlArguments):
    """One training run: the project's keys (``TrainOptions``: recipe, model, data, compression, rl, distill, lora,
    ...) and TRL's ``GRPOConfig`` fields under their own names and help (``learning_rate``, ``beta``, ``loss_type``,
    ``num_generations``, ``max_completion_length``, ``temperature``, ``top_p``, ``num_iterations``, ...;
    distillation uses those that transformers' ``TrainingArguments`` has, and the sampling fields it reads).
    ``DERIVED`` fields of ``gkv_train.config.trl_fields`` are set from the project's keys. Every value is checked
    here, when the configuration is built; TRL's own checks run when the trainer's arguments are built from it
    (``gkv_train.training.launch.trainer_args``), also before any work."""

    def __post_init__(self):
        if isinstance(self.report_to, str) or self.report_to is None:  # a name; null: none
            self.report_to = [] if self.report_to is None else [self.report_to]
        if not isinstance(self.report_to, (list, tuple)) or not all(isinstance(n, str) for n in self.report_to):
            raise ValueError(f"report_to must be a tracker name or a list of them, got {self.report_to!r}")
        self.report_to = list(self.report_to)
        self.check_values()
        self.check_combinations()
        check_trackers(self.report_to)
        if self.push_to_hub:
            check_hub_access()
        self.data.check("data")
        self.eval_data.check("eval_data")
        # the checks that read the configuration's groups, each module's in one run: the sampling keys and the
        # recipe (options), then the compression (gkv_rollout)
        check_sampling_keys(self, greedy=False)
        if self.algorithm == "grpo" and self.num_generations < 2:
            raise ValueError("num_generations must be at least 2: GRPO compares samples of one prompt")
        check_recipe(self.recipe, self.compression, self.rl)
        if not self.compression.compresses and self.compression.unread():
            raise ValueError(
                f"compression.options.{self.compression.unread()[0]} does not apply to compression.method=full"
            )
        if self.use_vllm and self.compression.compresses:
            raise ValueError("use_vllm generates with a full cache: it is only for rl_full (compression.method=full)")
        self.compression.check_generation(self.max_completion_length)
        check_compile_decode(self.compile_decode, [self.compression])

    def check_values(self) -> None:
        """Each key on its own: a known choice, a count of at least 1, a number in its range."""
        for name, choices in (("algorithm", ALGORITHMS), ("loss_type", LOSS_TYPES), ("precision", PRECISIONS)):
            if getattr(self, name) not in choices:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; choose one of {choices}")
        for name in (
            "prompts_per_step",
            "max_steps",
            "save_steps",
            "gradient_accumulation_steps",
            "logging_steps",
            "eval_samples",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name, low in TRL_AT_LEAST.items():
            if name in TRL_FIELDS and getattr(self, name) is not None and getattr(self, name) < low:
                raise ValueError(f"{name} must be at least {low}, got {getattr(self, name)}")
        for name, choices in TRL_CHOICES.items():
            if name in TRL_FIELDS and getattr(self, name) not in choices:
                raise ValueError(
                    f"unknown {name} {getattr(self, name)!r}; choose one of {', '.join(map(str, choices))}"
                )
        for name in ("eval_steps", "save_total_limit"):  # None: off / no limit
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 or null, got {getattr(self, name)}")
        check_range("learning_rate", self.learning_rate, low=0, low_open=True)
        check_range("warmup_steps", self.warmup_steps, low=0)
        check_range("max_grad_norm", self.max_grad_norm, low=0, note=" (0 turns gradient clipping off)")
        check_range("beta", self.beta, low=0, note=" (the KL weight; 0: no reference model)")
        check_range("epsilon", self.epsilon, low=0, low_open=True)
        if self.epsilon_high is not None:
            check_range("epsilon_high", self.epsilon_high, low=0, low_open=True)
        for weight in self.reward_weights or []:
            check_range("reward_weights", weight)

    def check_combinations(self) -> None:
        """Keys that contradict each other, or that the chosen algorithm, task or generation does not read."""
        if self.overwrite and self.resume is not None:
            raise ValueError(f"overwrite=true and resume={self.resume} contradict each other: choose one")
        if self.resume_other_run and (self.resume is None or self.resume == "last"):
            raise ValueError("resume_other_run=true applies to resume=<a checkpoint of another run's folder>")
        if self.data.name == LONG_RECALL and self.algorithm != "grpo":
            raise ValueError(
                f"data.name=long_recall with algorithm={self.algorithm}: its completions begin with a given story, "
                "which distillation would take for the model's own tokens; train on it with a GRPO recipe (rl_sparse, "
                "sparse_rl, rl_full: the story is fed through the cache, and only the sampled answer is trained on)"
            )
        if self.eval_data.name == LONG_RECALL and self.eval_steps is not None:
            raise ValueError(
                "eval_data.name=long_recall with eval_steps: the evaluation every eval_steps (TRL's loop) would leave "
                "out the story its completions begin with; drop eval_steps (the final evaluation feeds it)"
            )
        changed = [name for name in TRL_FIELDS if getattr(self, name) != TRL_FIELDS[name].default_value]
        ignored = [name for name in ENGINE_IGNORES if name in changed]  # (those the installed TRL has)
        if ignored and not self.use_vllm:
            raise ValueError(
                f"{', '.join(ignored)}: options of TRL's own generation, which the rollout engine does not have "
                "(it samples with temperature and top_p); drop them (use_vllm=true, rl_full only, generates "
                "through TRL's vLLM path, which reads them)"
            )
        grpo_only = sorted(name for name in GRPO_ONLY if name in changed)
        if grpo_only and self.algorithm == "distill":
            raise ValueError(
                f"{', '.join(grpo_only)}: GRPO options (TRL's GRPOConfig), but algorithm=distill trains with "
                "transformers' TrainingArguments, which has no such field: drop them or choose a GRPO recipe"
            )
        if self.use_vllm and self.compile_decode:
            raise ValueError("use_vllm generates through vLLM: compile_decode=true (the engine's option) has no effect")
        if self.reward_weights is not None and len(self.reward_weights) != len(self.rewards):
            raise ValueError(f"{len(self.reward_weights)} reward_weights for {len(self.rewards)} rewards")
