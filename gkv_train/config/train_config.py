"""The configuration of a training run (``train.py``, ``gkv-train train``): the trainer's own arguments with this
project's keys. ``GRPOTrainConfig`` is TRL's ``GRPOConfig`` (recipes rl_sparse, sparse_rl, rl_full) and
``DistillTrainConfig`` transformers' ``TrainingArguments`` (distill, distill_onpolicy), each with the project's keys
(``TrainOptions``: recipe, model, data, compression, lora, ...) and its option group (``rl``, ``distill``). Built
once, every value checked then (the project's checks, then TRL's / transformers' own ``__post_init__``), before any
work; the trainer receives the object itself. Importing this module imports TRL."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import TrainingArguments
from trl import GRPOConfig

from gkv_rollout.config import CompressionConfig, close_option
from gkv_rollout.contract.eviction import BACKENDS
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
    group,
)
from gkv_train.config.upstream import check_as_trainer_would, check_honoured
from gkv_train.problems.data import GIVEN_TASKS, DataConfig

# TrainingArguments / GRPOConfig fields set from this project's keys, so not keys of their own: field -> what sets it
DERIVED = {
    "per_device_train_batch_size": "prompts_per_step (rows per step: prompts_per_step x num_generations, "
    "divided by processes x gradient_accumulation_steps)",
    "per_device_eval_batch_size": "prompts_per_step x num_generations",
    "bf16": "precision=bf16",
    "fp16": "precision (fp32 or bf16)",
    "use_cpu": "the machine (true when no GPU)",
    "eval_strategy": "eval_steps",
    "save_strategy": "save_steps (a checkpoint every save_steps steps)",
    "activation_checkpointing": "gradient_checkpointing",
}
# transformers 5.23 renamed TrainingArguments.gradient_checkpointing to activation_checkpointing (the old name an
# alias until v6, with a FutureWarning); older releases (the GPU image's 5.17) know only the old name
RENAMED_CHECKPOINTING = "activation_checkpointing" in {f.name for f in dataclasses.fields(TrainingArguments)}


def changed(default, why: str, **metadata) -> Any:
    """A field of TRL's / transformers' whose default this project changes, and why (``metadata["why"]``: the help
    lists it after the field's own help, that of the base class that declares it)."""
    return field(default=default, metadata={"why": why, **metadata})


def process_count() -> int:
    """The training processes of this launch, from the environment its launcher sets, read as accelerate's
    ``PartialState`` reads it (``WORLD_SIZE``: accelerate launch, torchrun; MPI's own variables)."""
    from accelerate.utils import get_int_from_env

    return get_int_from_env(["WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"], 1)


def check_hub_access() -> None:
    """``push_to_hub=true`` needs the Hugging Face Hub: ValueError when it is switched off (``HF_HUB_OFFLINE``) or
    no token is found (checked before the model loads; the push would fail only after training)."""
    from huggingface_hub import constants, get_token

    if constants.HF_HUB_OFFLINE:
        raise ValueError(
            "push_to_hub=true needs the Hugging Face Hub, which HF_HUB_OFFLINE=1 switches off: drop "
            "push_to_hub, or unset HF_HUB_OFFLINE"
        )
    if get_token() is None:
        raise ValueError(
            "push_to_hub=true needs a Hugging Face token (huggingface-cli login, or HF_TOKEN), and none "
            "is set: drop push_to_hub, or log in"
        )


@dataclass
class TrainOptions:
    """The keys of a training run that TRL's and transformers' arguments do not have, mixed in before them (the
    configuration classes add those arguments' own fields, with their help), and the defaults of theirs that this
    project changes.

    recipe: the recipe (recipes/recipe/*.yaml): rl_sparse, rl_full, sparse_rl, distill, distill_onpolicy.
    algorithm: grpo (TRL's GRPOTrainer, ``gkv_train.training.grpo``) or distill (``gkv_train.training.distill``).
    model: a built-in model (smollm2-135m, tiny), a hub name or a local folder / GGUF file.
    data: the training problems.
    eval_data: the held-out problems of the final evaluation (and of eval_steps).
    compression: the rollouts' KV-cache compression (``compression.method=full``: none).
    compile_decode: the rollouts' decode steps as compiled graphs (not with s4r). The rollouts' other sampling
        keys are TRL's fields: num_generations (GRPO's group size), max_completion_length, temperature, top_p.
    chunk_given: given tokens (a task's given beginning, replayed traces) up to each compression point in one
        forward; false: one token per forward (``SamplingConfig.chunk_given``).
    prompts_per_step: GRPO: distinct prompts per optimizer step (rows: x num_generations); distillation:
        rows (traces or prompts) per step. Sets per_device_train_batch_size.
    precision: fp32 or bf16 (bf16: forwards under autocast, weights kept fp32; under accelerate launch, follows
        its mixed precision when not given). Sets bf16.
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
        count continue in this output_dir, which must be new or empty: a run there is another one).
    resume_model_only: allow resume= to continue a checkpoint saved without its optimizer and scheduler state
        (save_only_model=true): training goes on from its weights and step with a new optimizer and schedule.
    overwrite: write into an output_dir that holds another run (its files removed first) or other files (those of
        the names a run writes replaced); otherwise only an empty or new folder, or this run's (resume), is written.
    """

    recipe: str = "rl_sparse"
    algorithm: str = "grpo"
    model: str = "smollm2-135m"
    data: DataConfig = group(DataConfig)
    eval_data: DataConfig = group(DataConfig, split="test", limit=32)
    compression: CompressionConfig = group(CompressionConfig, method="gkv", budget=64, window=8, interval=16)
    compile_decode: bool = False
    chunk_given: bool = True
    prompts_per_step: int = 2
    precision: str = "fp32"
    gradient_checkpointing: bool = False
    lora: LoraOptions = group(LoraOptions)
    mask_backend: str = "auto"
    output_dir: str = "outputs/rl_sparse"
    report_to: Any = field(default_factory=list)
    eval_samples: int = 1
    resume: str | None = None
    resume_other_run: bool = False
    resume_model_only: bool = False
    overwrite: bool = False
    # transformers' TrainingArguments fields whose default here differs
    learning_rate: float = changed(2e-6, "RL-scale updates on the 135M default")
    lr_scheduler_type: str = changed("constant", "short runs compare recipes at one rate")
    max_steps: int = changed(6, "a CPU-scale run; set it for real runs")
    save_steps: float = changed(1, "a complete checkpoint every step: no work lost on a kill")
    save_total_limit: int | None = changed(2, "the newest two checkpoints")
    logging_steps: float = changed(1, "every step's metrics in metrics.jsonl")
    seed: int = changed(0, "this project's seed everywhere")
    # the rollouts' sampling under TRL's names: GRPOConfig's fields, which distillation's samples read too (its
    # help where TrainingArguments has no such field)
    max_completion_length: int | None = changed(
        96, "a CPU-scale completion; set it for real runs", help="On-policy samples: the longest completion."
    )
    temperature: float = changed(
        0.6, "the recipes' measured sampling", help="The temperature of the log-probs, the divergence and samples."
    )
    top_p: float = changed(0.95, "the recipes' measured sampling", help="On-policy samples: nucleus sampling.")

    def __post_init__(self):
        """The project's checks, the fields of TRL's / transformers' it does not honour (``upstream.check_honoured``),
        then the fields set from its keys (``DERIVED``), TRL's / transformers' own checks, and those they make only once
        the trainer is built (``upstream.check_as_trainer_would``)."""
        if isinstance(self.report_to, str) or self.report_to is None:  # a name; null: none
            self.report_to = [] if self.report_to is None else [self.report_to]
        if not isinstance(self.report_to, (list, tuple)) or not all(isinstance(n, str) for n in self.report_to):
            raise ValueError(f"report_to must be a tracker name or a list of them, got {self.report_to!r}")
        self.report_to = list(self.report_to)
        if self.push_to_hub:
            check_hub_access()
        self.check_values()
        self.check_combinations()
        # the checks of other modules, each module's in one run: options, the data, the compression (gkv_rollout)
        check_trackers(self.report_to)
        check_sampling_keys(self, greedy=False)
        check_compile_decode(self.compile_decode, [self.compression])
        self.data.check("data")
        self.eval_data.check("eval_data")
        if not self.compression.compresses and self.compression.unread():
            raise ValueError(
                f"compression.{self.compression.unread()[0]} does not apply to compression.method=full"
                f"{close_option(self.compression.unread()[0])}"
            )
        self.compression.check_generation(self.max_completion_length)
        check_honoured(self)
        self.derive()
        super().__post_init__()
        check_as_trainer_would(self)

    @property
    def rows_per_step(self) -> int:
        """Rows of one optimizer step: GRPO's prompts x num_generations; distillation's traces or prompts."""
        return self.prompts_per_step

    def derive(self) -> None:
        """Set the trainer's fields that follow from the project's keys (``DERIVED``)."""
        per_step = process_count() * self.gradient_accumulation_steps
        if self.rows_per_step % per_step:
            raise ValueError(
                f"{self.rows_per_step} rows per step must be divisible by processes x gradient_accumulation_steps "
                f"({per_step})"
            )
        self.per_device_train_batch_size = self.rows_per_step // per_step
        self.bf16, self.fp16 = self.precision == "bf16", False
        self.use_cpu = not torch.cuda.is_available()
        self.save_strategy = "steps"
        self.run_name = self.run_name or os.path.basename(os.path.normpath(self.output_dir))
        if RENAMED_CHECKPOINTING:
            self.activation_checkpointing = self.gradient_checkpointing

    def check_values(self) -> None:
        """Each key on its own: a known choice, a count of at least 1, a number in its range."""
        for name, choices in (("precision", PRECISIONS), ("mask_backend", BACKENDS)):
            if getattr(self, name) not in choices:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; choose one of {choices}")
        if self.mask_backend == "flex" and not torch.cuda.is_available():
            raise ValueError(
                "mask_backend=flex: torch's FlexAttention has no backward pass on the CPU, so a training forward "
                "cannot use it on this machine: mask_backend=sdpa (or auto: flex on CUDA, sdpa elsewhere)"
            )
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
        for name in ("eval_steps", "save_total_limit"):  # None: off / no limit
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 or null, got {getattr(self, name)}")
        check_range("learning_rate", self.learning_rate, low=0, low_open=True)
        check_range("warmup_steps", self.warmup_steps, low=0)
        check_range("max_grad_norm", self.max_grad_norm, low=0, note=" (0 turns gradient clipping off)")

    def check_combinations(self) -> None:
        """Keys that contradict each other, or that the chosen task or generation does not read."""
        if self.overwrite and self.resume is not None:
            raise ValueError(f"overwrite=true and resume={self.resume} contradict each other: choose one")
        if self.resume_other_run and (self.resume is None or self.resume == "last"):
            raise ValueError("resume_other_run=true applies to resume=<a checkpoint of another run's folder>")
        if self.resume_model_only and self.resume is None:
            raise ValueError(
                "resume_model_only=true applies to resume=last or resume=<checkpoint> (a checkpoint saved without "
                "its optimizer state)"
            )
        if self.eval_data.name in GIVEN_TASKS and self.eval_steps is not None:
            raise ValueError(
                f"eval_data.name={self.eval_data.name} with eval_steps: the evaluation every eval_steps (TRL's loop) "
                "would leave out the given text its completions begin with; drop eval_steps (the final evaluation "
                "feeds it)"
            )

    def to_dict(self) -> dict:
        """transformers' ``to_dict`` (logs, trackers, JSON), each option group (a dataclass field) as a dict."""
        found = super().to_dict()
        return {
            key: dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value for key, value in found.items()
        }


@dataclass
class GRPOTrainConfig(TrainOptions, GRPOConfig):
    """A GRPO run (recipes rl_sparse, sparse_rl, rl_full): TRL's ``GRPOConfig`` itself, every field under its own
    name and help (``learning_rate``, ``beta``, ``loss_type``, ``num_generations``, ``max_completion_length``,
    ``temperature``, ``top_p``, ``num_iterations``, ...), with the project's keys (``TrainOptions``) and RL-Sparse's
    options (``rl``); ``CompressedGRPOTrainer`` takes it as its arguments.

    rewards: reward functions by import path (plain callables, TRL's signature). Naming one imports its module,
        whose code runs: like a trust-remote-code choice, a configuration names code to run.
    rl: what RL-Sparse adds to GRPO (training under the record; importance sampling against the rollout).
    """

    rewards: list[str] = field(default_factory=lambda: ["gkv_rewards.functions.accuracy"])
    rl: SparseRLOptions = group(SparseRLOptions)
    # GRPOConfig fields whose default here differs from TRL's
    num_generations: int | None = changed(8, "pinned, the recipes' measured group size")
    epsilon_high: float | None = changed(0.28, "DAPO's clip-higher")
    # TRL 1.16's own defaults, pinned: the loss the recipes were measured with, whatever a later TRL defaults to
    loss_type: str = changed("dapo", "pinned, the recipes' measured loss")
    beta: float = changed(0.0, "pinned, the recipes' measured loss")
    epsilon: float = changed(0.2, "pinned, the recipes' measured loss")
    scale_rewards: Any = changed("group", "pinned, the recipes' measured loss")

    @property
    def rows_per_step(self) -> int:
        return self.prompts_per_step * self.num_generations

    def check_values(self) -> None:
        super().check_values()
        if self.algorithm != "grpo":
            raise ValueError(f"algorithm={self.algorithm} is not GRPO's: its configuration is DistillTrainConfig")
        if not self.rewards:
            raise ValueError(
                "rewards=[]: GRPO needs at least one reward function (rewards=[gkv_rewards.functions.accuracy])"
            )
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"unknown loss_type {self.loss_type!r}; choose one of {LOSS_TYPES}")
        if self.num_generations is None or self.num_generations < 2:
            raise ValueError(
                f"num_generations must be at least 2 (GRPO compares samples of one prompt), got {self.num_generations}"
            )
        # values TRL checks only once the trainer is built (after the model loads), or never
        for name in ("num_iterations", "steps_per_generation", "generation_batch_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        choices = ("group", "batch", "none", True, False)
        if self.scale_rewards not in choices:
            raise ValueError(
                f"unknown scale_rewards {self.scale_rewards!r}; choose one of {', '.join(map(str, choices))}"
            )
        check_range("beta", self.beta, low=0, note=" (the KL weight; 0: no reference model)")
        check_range("epsilon", self.epsilon, low=0, low_open=True)
        if self.epsilon_high is not None:
            check_range("epsilon_high", self.epsilon_high, low=0, low_open=True)
        for weight in self.reward_weights or []:
            check_range("reward_weights", weight)

    def check_combinations(self) -> None:
        super().check_combinations()
        check_recipe(self.recipe, self.algorithm, self.compression, self.rl)
        if self.use_vllm and self.compression.compresses:
            raise ValueError("use_vllm generates with a full cache: it is only for rl_full (compression.method=full)")
        if self.use_vllm and self.compile_decode:
            raise ValueError("use_vllm generates through vLLM: compile_decode=true (the engine's option) has no effect")
        if self.use_vllm and not self.chunk_given:
            raise ValueError("use_vllm generates through vLLM: chunk_given=false (the engine's option) has no effect")
        if self.reward_weights is not None and len(self.reward_weights) != len(self.rewards):
            raise ValueError(f"{len(self.reward_weights)} reward_weights for {len(self.rewards)} rewards")

    def derive(self) -> None:
        super().derive()
        self.eval_strategy = "no" if self.eval_steps is None else "steps"
        self.per_device_eval_batch_size = self.rows_per_step // process_count()


@dataclass
class DistillTrainConfig(TrainOptions, TrainingArguments):
    """A distillation run (recipes distill, distill_onpolicy): transformers' ``TrainingArguments`` itself, with the
    project's keys (``TrainOptions``), the sampling fields under TRL's names (on-policy samples, the divergence's
    temperature) and the distillation options (``distill``); ``CompressedDistillationTrainer`` takes it as its
    arguments.

    distill: distillation (mode, divergence, teacher, traces, chunking).
    remove_unused_columns: False: the trainer reads whole rows (traces or prompts with answers).
    """

    algorithm: str = "distill"
    recipe: str = "distill"
    distill: DistillOptions = group(DistillOptions)
    remove_unused_columns: bool = False

    def check_values(self) -> None:
        super().check_values()
        if self.algorithm != "distill":
            raise ValueError(f"algorithm={self.algorithm} is not distillation's: its configuration is GRPOTrainConfig")

    def check_combinations(self) -> None:
        super().check_combinations()
        check_recipe(self.recipe, self.algorithm, self.compression, mode=self.distill.mode)
        if self.data.name in GIVEN_TASKS and not (self.distill.mode == "offline" and self.distill.traces):
            raise ValueError(
                f"data.name={self.data.name} with algorithm=distill: its completions begin with given text, which "
                "distillation would take for the model's own tokens; train on it with a GRPO recipe (rl_sparse, "
                "sparse_rl, rl_full: the given text is fed through the cache, and only the sampled tokens are trained "
                "on), or distil offline from traces that mark it (distill.traces=<file> with a given count per "
                "trace: gkv-train traces source=solution)"
            )


# algorithm -> its configuration class
TRAIN_CONFIGS = {"grpo": GRPOTrainConfig, "distill": DistillTrainConfig}
assert tuple(TRAIN_CONFIGS) == ALGORITHMS
TrainConfig = GRPOTrainConfig | DistillTrainConfig  # either, in annotations
