"""The configurations of ``train.py`` (``TrainConfig``), ``scripts/evaluate.py`` (``EvalConfig``) and
``scripts/generate_traces.py`` (``TracesConfig``): Hydra's schemas, validated when built, before any work.

``TrainConfig`` is the project's keys (``TrainOptions``) plus TRL's ``GRPOConfig`` fields under their own names,
types and help (generated from the installed TRL on first use), so that a TRL user's ``learning_rate``,
``weight_decay`` or ``num_iterations`` is a key as it is. The three share the groups ``data``, ``compression``
and ``sampling`` (``SamplingOptions``: num_generations, max_new_tokens, temperature, top_p, compile_decode) and
the key ``seed``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from gkv_rollout.config import CompressionConfig, SamplingConfig, flat_fields
from gkv_train.data import DataConfig

ALGORITHMS = ("grpo", "distill")
# TRL's GRPO losses; each is ratio x advantage, so truncated importance sampling (``rl.rollout_is``) applies
LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo")
IS_MODES = ("token_truncate", "sequence_truncate")
DISTILL_MODES = ("offline", "onpolicy")
DIVERGENCES = ("forward_kl", "sft")
PRECISIONS = ("fp32", "bf16")


def slug(name: str | None) -> str:
    """A folder-name form of a model or dataset name or path: its last component, without a file suffix."""
    if not name:
        return "none"
    last = Path(str(name).rstrip("/")).name
    last = last.rsplit(".", 1)[0] if last.endswith((".gguf", ".jsonl", ".json", ".parquet")) else last
    return re.sub(r"[^A-Za-z0-9._-]+", "-", last) or "none"


def run_folder(model: str, data_name: str | None, data_path: str | None) -> str:
    """The default output sub-folder of a run: ``<model>_<data>`` (the ``gkv_dir`` resolver of the recipes)."""
    return f"{slug(model)}_{slug(data_name or data_path)}"


OmegaConf.register_new_resolver("gkv_dir", run_folder, replace=True)


def check_range(
    key: str, value, low=None, high=None, low_open: bool = False, high_open: bool = False, note: str = ""
) -> None:
    """``value`` (of the configuration key ``key``) a finite number within [low, high] (``low_open`` /
    ``high_open``: the bound itself excluded; None: unbounded); ValueError naming the key and the range."""
    below = low is not None and (value <= low if low_open else value < low)
    above = high is not None and (value >= high if high_open else value > high)
    if not math.isfinite(value) or below or above:
        if high is None:
            wanted = f"{'>' if low_open else '>='} {low}"
        elif low is None:
            wanted = f"{'<' if high_open else '<='} {high}"
        else:
            wanted = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{key} must be a finite number {wanted}{note}, got {value}")


def check_sampling(temperature: float, top_p: float, greedy: bool) -> None:
    """Sampling settings: a finite ``temperature`` > 0 (>= 0 when ``greedy`` decoding is allowed, i.e. in
    evaluation) and 0 < ``top_p`` <= 1; raises ValueError naming the problem."""
    lowest = 0 <= temperature if greedy else 0 < temperature
    if not (math.isfinite(temperature) and lowest):
        need = (
            ">= 0 (0: greedy)"
            if greedy
            else "> 0 in training (greedy decoding, temperature=0, is an evaluation setting)"
        )
        raise ValueError(f"temperature must be a finite number {need}, got {temperature}")
    if not (math.isfinite(top_p) and 0 < top_p <= 1):
        raise ValueError(f"top_p must lie in (0, 1], got {top_p}")


@dataclass
class SparseRLOptions:
    """What RL-Sparse adds to TRL's GRPO options (``rl.*`` keys of ``train.py``).

    train_with_record: attend under the rollout's record in every trainer forward. False: a dense learner
        (plain causal attention): a control that must show a large mismatch; RL-Full's setting; and with a
        compressed rollout Sparse-RL's design (recipe ``sparse_rl``: the mismatch is then corrected by the options
        below). With ``recipe=rl_full`` and a compressing method it must be given explicitly.
    overlong_advantage_clip: clamp the advantage of completions that hit ``max_new_tokens`` to >= 0.
    rollout_is: importance sampling between the trainer's (old-policy) and the rollout's log-probs:
        ``token_truncate`` (per-token weights min(exp(trainer - rollout), cap)) or ``sequence_truncate`` (one
        weight per completion, of the summed difference); None disables it. ``auto`` (default): ``token_truncate``
        with ``precision=bf16``, where rollout and trainer log-probs differ by bf16 rounding (measured on
        SmolLM2: mean |diff| 0.027, max 0.25, the size of PPO's clip range), None in fp32, where they agree to
        1e-4 and every weight would be 1 (so the extra old-policy forward it needs is saved).
    rollout_is_cap: the truncation cap of the weights (Sparse-RL: 1.5).
    rollout_is_normalize: divide the weights by their mean over the generation batch's completion tokens
        (per completion for ``sequence_truncate``), so they average 1 (Sparse-RL: true).
    rollout_rejection: [low, high]: completion tokens whose ratio exp(trainer - rollout) lies outside are left out
        of the loss and of its normaliser (Sparse-RL: [0.5, 1.5]); None keeps every token.
    rollout_veto: a completion with any token ratio below this is left out of the loss entirely (Sparse-RL:
        1e-4); None vetoes nothing.
    """

    train_with_record: bool = True
    overlong_advantage_clip: bool = True
    rollout_is: str | None = "auto"
    rollout_is_cap: float = 2.0
    rollout_is_normalize: bool = False
    rollout_rejection: list[float] | None = None
    rollout_veto: float | None = None

    def __post_init__(self):
        if self.rollout_is is not None and self.rollout_is not in (*IS_MODES, "auto"):
            raise ValueError(f"unknown rollout_is mode {self.rollout_is!r}; choose one of {IS_MODES}, auto or null")
        check_range("rl.rollout_is_cap", self.rollout_is_cap, low=0, low_open=True)
        if self.rollout_is_normalize and self.rollout_is is None:
            raise ValueError("rl.rollout_is_normalize=true normalises importance weights: set rl.rollout_is too")
        if self.rollout_rejection is not None:
            band = list(self.rollout_rejection)
            if len(band) != 2 or not 0 <= band[0] < 1 < band[1]:
                raise ValueError(f"rl.rollout_rejection must be [low, high] with 0 <= low < 1 < high, got {band}")
        if self.rollout_veto is not None and not 0 < self.rollout_veto < 1:
            raise ValueError(f"rl.rollout_veto must lie in (0, 1), got {self.rollout_veto}")

    @property
    def corrects_rollout(self) -> bool:
        """Whether the trainer's old-policy log-probs are compared with the rollout's to weight or drop tokens."""
        return self.rollout_is is not None or self.rollout_rejection is not None or self.rollout_veto is not None


@dataclass
class DistillOptions:
    """Distillation (``algorithm=distill``; ``distill.*`` keys of ``train.py``).

    mode: ``offline`` (teacher traces replayed through the student's compressed cache) or ``onpolicy``
        (the student samples under compression, the teacher scores the same tokens).
    divergence: ``forward_kl`` (KL(teacher || student) at the sampling temperature, x T^2) or ``sft``.
    teacher: the full-attention teacher; None: a frozen copy of the initial model.
    traces: a traces JSONL (``scripts/generate_traces.py``) for offline mode; None: generated at start from
        the first ``trace_problems`` training problems, ``trace_samples`` samples each (correct ones kept).
    trace_problems: offline traces generated at start (no ``traces``): from the first N training problems.
    trace_samples: offline traces generated at start: completions per problem (correct ones kept).
    chunk_tokens: tokens per LM-head chunk of the loss (memory: chunk_tokens x vocab logits at once).
    """

    mode: str = "offline"
    divergence: str = "forward_kl"
    teacher: str | None = None
    traces: str | None = None
    trace_problems: int = 64
    trace_samples: int = 4
    chunk_tokens: int = 512

    def __post_init__(self):
        if self.mode not in DISTILL_MODES:
            raise ValueError(f"unknown distillation mode {self.mode!r}; choose one of {DISTILL_MODES}")
        if self.divergence not in DIVERGENCES:
            raise ValueError(f"unknown divergence {self.divergence!r}; choose one of {DIVERGENCES}")
        if min(self.trace_problems, self.trace_samples, self.chunk_tokens) < 1:
            raise ValueError("distill.trace_problems, trace_samples and chunk_tokens must be at least 1")


@dataclass
class LoraOptions:
    """LoRA adapters (``lora.*``; PEFT) instead of training every weight.

    enabled: train LoRA adapters only; the saved run is an adapter (``gkv-train export`` merges it).
    r: the adapters' rank.
    alpha: their scaling numerator (scale alpha / r).
    dropout: dropout on the adapters' input. [Default here 0.0, TRL's ModelConfig 0.05: with dropout the trainer's
        forward is not the rollout's, so its log-probs under the record would not equal the rollout's.]
    target_modules: the linear layers that get adapters. [Default here the attention projections, TRL's
        ModelConfig None (PEFT's choice per architecture): the layers whose inputs the record masks.]
    """

    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])

    def __post_init__(self):
        check_range("lora.r", self.r, low=1)
        check_range("lora.alpha", self.alpha, low=0, low_open=True)
        check_range("lora.dropout", self.dropout, low=0, high=1, high_open=True)


@dataclass
class CompressedArguments:
    """What both trainers' arguments (``CompressedGRPOConfig``, ``CompressedDistillationConfig``) add to TRL's /
    transformers' own, mixed in before them: the compression the rollouts run with and how training forwards attend
    under its record; ``to_dict`` (which transformers uses for logs, trackers and JSON) writes each option group
    (a dataclass field) as a dict."""

    compression: CompressionConfig = field(
        default_factory=lambda: CompressionConfig("gkv"),
        metadata={
            "help": "The rollouts' KV-cache compression (gkv_rollout.config.CompressionConfig); "
            "CompressionConfig('full') for none (RL-Full)."
        },
    )
    mask_backend: str = field(
        default="auto",
        metadata={
            "help": "How training forwards attend under the record: auto (FlexAttention on CUDA, SDPA "
            "elsewhere), flex or sdpa."
        },
    )

    def to_dict(self) -> dict:
        found = super().to_dict()
        return {key: asdict(value) if is_dataclass(value) else value for key, value in found.items()}


@dataclass
class SamplingOptions:
    """How completions are sampled: the ``sampling.*`` keys, one group shared by ``train.py``,
    ``scripts/evaluate.py`` and ``scripts/generate_traces.py`` (``engine`` builds the rollout engine's
    ``SamplingConfig`` from it; the seed is the job's ``seed``).

    num_generations: completions per prompt: GRPO's group size (TRL's name; >= 2), evaluation's samples per
        problem, traces' per problem; on-policy distillation samples one and ignores it.
    max_new_tokens: the longest completion (TRL: max_completion_length).
    temperature: sampling temperature (0: greedy, an evaluation and traces setting; > 0 in training).
    top_p: nucleus sampling (log-probs are always those of the unclipped distribution).
    compile_decode: decode steps as compiled graphs (``SamplingConfig.compile_decode``; not with s4r).
    """

    num_generations: int = 4
    max_new_tokens: int = 256
    temperature: float = 0.6
    top_p: float = 0.95
    compile_decode: bool = False

    def __post_init__(self):
        check_sampling(self.temperature, self.top_p, greedy=True)
        for name in ("num_generations", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"sampling.{name} must be at least 1, got {getattr(self, name)}")

    def engine(self, seed: int, num_samples: int | None = None) -> SamplingConfig:
        """The rollout engine's ``SamplingConfig``: ``num_samples`` completions per prompt (None:
        ``num_generations``), seeded with ``seed``."""
        return SamplingConfig(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            num_samples=self.num_generations if num_samples is None else num_samples,
            seed=seed,
            compile_decode=self.compile_decode,
        )


@dataclass
class TrainOptions:
    """The keys of a training run that TRL's ``GRPOConfig`` does not have (``TrainConfig`` adds GRPOConfig's own
    fields, with TRL's help).

    recipe: the recipe (recipes/recipe/*.yaml): rl_sparse, rl_full, sparse_rl, distill, distill_onpolicy.
    algorithm: grpo (TRL's GRPOTrainer, ``gkv_train.grpo``) or distill (``gkv_train.distill``).
    model: a built-in model (smollm2-135m, tiny), a hub name or a local folder / GGUF file.
    data: the training problems.
    eval_data: the held-out problems of the final evaluation (and of eval_steps).
    compression: the rollouts' KV-cache compression (``compression.method=full``: none).
    sampling: the rollouts' sampling (GRPO: num_generations is the group size).
    prompts_per_step: GRPO: distinct prompts per optimizer step (rows: x sampling.num_generations); distillation:
        rows (traces or prompts) per step. Sets TRL's per_device_train_batch_size.
    rewards: reward functions by import path (plain callables, TRL's signature). Naming one imports its module,
        whose code runs: like a trust-remote-code choice, a configuration names code to run.
    rl: what RL-Sparse adds to GRPO (training under the record; importance sampling against the rollout).
    distill: distillation (algorithm=distill).
    precision: fp32 or bf16 (bf16: forwards under autocast, weights kept fp32; under accelerate launch, follows
        its mixed precision when not given). Sets TRL's bf16.
    gradient_checkpointing: recompute activations in the backward (memory for time).
    lora: LoRA adapters instead of training every weight.
    mask_backend: how training forwards attend under the record: auto, flex (FlexAttention block masks) or sdpa.
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
    sampling: SamplingOptions = field(default_factory=lambda: SamplingOptions(num_generations=8, max_new_tokens=96))
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

    def __post_init__(self):
        self.data.check("data")
        self.eval_data.check("eval_data")
        if isinstance(self.report_to, str) or self.report_to is None:  # a name; null: none
            self.report_to = [] if self.report_to is None else [self.report_to]
        if not isinstance(self.report_to, (list, tuple)) or not all(isinstance(n, str) for n in self.report_to):
            raise ValueError(f"report_to must be a tracker name or a list of them, got {self.report_to!r}")
        self.report_to = list(self.report_to)
        check_trackers(self.report_to)
        if self.sampling.temperature <= 0:
            check_sampling(self.sampling.temperature, self.sampling.top_p, greedy=False)
        if self.overwrite and self.resume is not None:
            raise ValueError(f"overwrite=true and resume={self.resume} contradict each other: choose one")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}; choose one of {ALGORITHMS}")
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"unknown loss_type {self.loss_type!r}; choose one of {LOSS_TYPES}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; choose one of {PRECISIONS}")
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
        if self.push_to_hub:
            check_hub_access()
        if self.resume_other_run and (self.resume is None or self.resume == "last"):
            raise ValueError("resume_other_run=true applies to resume=<a checkpoint of another run's folder>")
        for compression in (self.compression,):
            compression.check_generation(self.sampling.max_new_tokens)
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
        if self.reward_weights is not None:
            for weight in self.reward_weights:
                check_range("reward_weights", weight)
        check_recipe(self.recipe, self.compression, self.rl)
        if not self.compression.compresses and self.compression.unread():
            raise ValueError(
                f"compression.options.{self.compression.unread()[0]} does not apply to compression.method=full"
            )
        if self.algorithm == "grpo" and self.sampling.num_generations < 2:
            raise ValueError("sampling.num_generations must be at least 2: GRPO compares samples of one prompt")
        if not self.use_vllm:
            ignored = [
                name
                for name in ENGINE_IGNORES  # (those the installed TRL has)
                if name in TRL_FIELDS and getattr(self, name) != TRL_FIELDS[name].default_value
            ]
            if ignored:
                raise ValueError(
                    f"{', '.join(ignored)}: options of TRL's own generation, which the rollout engine does not have "
                    "(it samples with sampling.temperature and sampling.top_p); drop them (use_vllm=true, rl_full "
                    "only, generates through TRL's vLLM path, which reads them)"
                )
        if self.algorithm == "distill":
            changed = sorted(name for name in GRPO_ONLY if getattr(self, name) != TRL_FIELDS[name].default_value)
            if changed:
                raise ValueError(
                    f"{', '.join(changed)}: GRPO options (TRL's GRPOConfig), but algorithm=distill trains with "
                    "transformers' TrainingArguments, which has no such field: drop them or choose a GRPO recipe"
                )
        check_compile_decode(self.sampling.compile_decode, [self.compression])
        if self.use_vllm and self.sampling.compile_decode:
            raise ValueError(
                "use_vllm generates through vLLM: sampling.compile_decode=true (the engine's option) has no effect"
            )
        if self.use_vllm and self.compression.compresses:
            raise ValueError("use_vllm generates with a full cache: it is only for rl_full (compression.method=full)")
        if self.reward_weights is not None and len(self.reward_weights) != len(self.rewards):
            raise ValueError(f"{len(self.reward_weights)} reward_weights for {len(self.rewards)} rewards")


# GRPOConfig / TrainingArguments fields set from this project's keys, so not keys of their own: field -> what sets it
DERIVED = {
    "per_device_train_batch_size": "prompts_per_step (rows per step: prompts_per_step x sampling.num_generations, "
    "divided by processes x gradient_accumulation_steps)",
    "per_device_eval_batch_size": "prompts_per_step x sampling.num_generations",
    "num_generations": "sampling.num_generations",
    "max_completion_length": "sampling.max_new_tokens",
    "temperature": "sampling.temperature",
    "top_p": "sampling.top_p",
    "bf16": "precision=bf16",
    "fp16": "precision (fp32 or bf16)",
    "use_cpu": "the machine (true when no GPU)",
    "eval_strategy": "eval_steps",
    "save_strategy": "save_steps (a checkpoint every save_steps steps)",
    "activation_checkpointing": "gradient_checkpointing",
}
# GRPOConfig fields whose default here differs from TRL's: field -> (default, why)
PROJECT_DEFAULTS = {
    "learning_rate": (2e-6, "RL-scale updates on the 135M default"),
    "lr_scheduler_type": ("constant", "short runs compare recipes at one rate"),
    "max_steps": (6, "a CPU-scale run; set it for real runs"),
    "save_steps": (1, "a complete checkpoint every step: no work lost on a kill"),
    "save_total_limit": (2, "the newest two checkpoints"),
    "logging_steps": (1, "every step's metrics in metrics.jsonl"),
    "seed": (0, "this project's seed everywhere"),
    "epsilon_high": (0.28, "DAPO's clip-higher"),
    # TRL 1.16's own defaults, pinned: the loss the recipes were measured with, whatever a later TRL defaults to
    "loss_type": ("dapo", "pinned, the recipes' measured loss"),
    "beta": (0.0, "pinned, the recipes' measured loss"),
    "epsilon": (0.2, "pinned, the recipes' measured loss"),
    "scale_rewards": ("group", "pinned, the recipes' measured loss"),
}
# TRL fields whose values TRL checks only once the trainer is built (after the model loads), or never: the least
# value, and the values allowed
TRL_AT_LEAST = {"num_iterations": 1, "steps_per_generation": 1, "generation_batch_size": 1}
TRL_CHOICES = {"scale_rewards": ("group", "batch", "none", True, False)}


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


# GRPOConfig fields that TRL's own generation reads and the rollout engine does not: refused unless use_vllm
ENGINE_IGNORES = (
    "top_k",
    "min_p",
    "repetition_penalty",
    "generation_kwargs",
    "cache_implementation",
    "use_transformers_paged",
    "use_transformers_continuous_batching",
    "transformers_continuous_batching_config",
    "chat_template_kwargs",
)


@dataclass(frozen=True)
class TrlField:
    """One GRPOConfig field as a key of ``TrainConfig``: its TRL type, default and help."""

    name: str
    kind: Any
    default_value: Any
    help: str


def _schema_type(kind):
    """The type OmegaConf checks a field with: simple types, their Optional and lists of them as is; Any for the
    rest (unions, enums, dicts), which GRPOConfig's own ``__post_init__`` checks when the trainer's arguments are
    built."""
    import types
    import typing

    simple = (bool, int, float, str)
    if kind in simple:
        return kind
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and _schema_type(rest[0]) is not Any:
            return _schema_type(rest[0]) | None
        return Any
    if origin is list and len(args) == 1 and args[0] in simple:
        return kind
    return Any


def _trl_fields() -> dict[str, TrlField]:
    """GRPOConfig's fields that are keys of ``TrainConfig`` (not the project's own, not ``DERIVED``)."""
    import enum
    import typing

    from trl import GRPOConfig

    hints = typing.get_type_hints(GRPOConfig)
    own = {f.name for f in dataclasses.fields(TrainOptions)}
    found = {}
    for f in dataclasses.fields(GRPOConfig):
        if f.name in own or f.name in DERIVED or f.name == "gradient_checkpointing" or f.name.startswith("_"):
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        else:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        default = default.value if isinstance(default, enum.Enum) else default
        default, why = PROJECT_DEFAULTS.get(f.name, (default, None))
        text = " ".join(f.metadata.get("help", "").split())
        if why is not None:
            text = f"{text} [Default here {default!r}: {why}.]"
        found[f.name] = TrlField(f.name, hints[f.name], default, text)
    return found


def _train_config() -> type:
    """``TrainOptions`` + every ``GRPOConfig`` field of ``TRL_FIELDS``: the one schema of ``train.py``."""
    import copy

    fields = []
    for key, trl in TRL_FIELDS.items():
        value = trl.default_value
        metadata = {"help": trl.help, "type": trl.kind}
        if isinstance(value, (list, dict)):
            default = field(default_factory=lambda v=value: copy.deepcopy(v), metadata=metadata)
        else:
            default = field(default=value, metadata=metadata)
        fields.append((key, _schema_type(trl.kind), default))
    config = dataclasses.make_dataclass("TrainConfig", fields, bases=(TrainOptions,))
    config.__module__ = __name__
    config.__doc__ = (
        "One training run: the project's keys (``TrainOptions``: recipe, model, data, compression, sampling, rl, "
        "distill, lora, ...) and TRL's ``GRPOConfig`` fields under their own names and help (``learning_rate``, "
        "``beta``, ``loss_type``, ``weight_decay``, ``num_iterations``, ...; distillation uses those that "
        "transformers' ``TrainingArguments`` has). ``DERIVED`` fields are set from the project's keys."
    )
    return config


@functools.cache
def _generate() -> None:
    """Build ``TRL_FIELDS``, ``GRPO_ONLY`` and ``TrainConfig`` from the installed TRL, on first use (evaluation and
    traces need none of them, and so do not import TRL)."""

    from transformers import TrainingArguments

    global TRL_FIELDS, GRPO_ONLY, TrainConfig
    TRL_FIELDS = _trl_fields()
    GRPO_ONLY = tuple(sorted(set(TRL_FIELDS) - {f.name for f in dataclasses.fields(TrainingArguments)}))
    TrainConfig = _train_config()


def __getattr__(name: str):
    if name in ("TRL_FIELDS", "GRPO_ONLY", "TrainConfig"):  # built on first use
        _generate()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class TracesConfig:
    """One call of ``scripts/generate_traces.py``: full-cache completions of a teacher, checked; the correct ones
    (``keep_incorrect``: all) written as JSONL for offline distillation (``distill.traces``).

    model: the teacher: a built-in model (smollm2-135m, tiny), a hub name or a local folder / GGUF file.
    data: the problems.
    sampling: how completions are sampled (num_generations: completions per problem).
    seed: seeds the sampling.
    keep_incorrect: write wrong completions too.
    output: the traces file (JSONL); refused when another job writes it.
    """

    model: str = "smollm2-135m"
    data: DataConfig = field(default_factory=lambda: DataConfig(limit=64))
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    seed: int = 0
    keep_incorrect: bool = False
    output: str = "outputs/traces.jsonl"

    def __post_init__(self):
        self.data.check("data")


# CompressionConfig fields added after results were first keyed by settings: left out of a run's identity while
# the run behaves as before they existed (s4r without refresh, whatever refresh_rank says), so earlier results
# stay valid
LATER_COMPRESSION_FIELDS = ("refresh", "refresh_rank")


def compression_identity(compression: CompressionConfig) -> dict:
    """The resolved compression settings that determine a run's results (``LATER_COMPRESSION_FIELDS`` left out
    when refresh is off)."""
    settings = compression.flat()
    if settings["refresh"] == 0:
        settings = {k: v for k, v in settings.items() if k not in LATER_COMPRESSION_FIELDS}
    return settings


def check_recipe(recipe: str, compression: CompressionConfig, rl: SparseRLOptions) -> None:
    """``recipe=rl_full`` (full-cache rollouts, full-attention training) with a compressing method contradicts
    itself, unless ``rl.train_with_record=false`` asks for a dense learner on compressed rollouts (a baseline);
    training under the record is ``recipe=rl_sparse``. ValueError naming both ways."""
    if recipe == "rl_full" and compression.compresses and rl.train_with_record:
        raise ValueError(
            f"recipe=rl_full trains on full-cache rollouts, but compression.method={compression.method} compresses "
            "them: use recipe=rl_sparse to train under the rollouts' record, or add rl.train_with_record=false to "
            "train a full-attention learner on the compressed rollouts (the dense-learner baseline)"
        )


TRACKERS = {  # report_to name -> the modules that provide it (any one)
    "tensorboard": ("tensorboard", "tensorboardX"),
    "wandb": ("wandb",),
    "mlflow": ("mlflow",),
    "trackio": ("trackio",),
}


def check_compile_decode(
    compile_decode: bool, compressions: list[CompressionConfig], key: str = "sampling.compile_decode"
) -> None:
    """``compile_decode`` (the option ``key``) only with caches that have a static decode step
    (``Method.static_decode``); raises ValueError."""
    dynamic = [c.method for c in compressions if not c.kind.static_decode]
    if compile_decode and dynamic:
        raise ValueError(
            f"{key}=true does not apply to {dynamic[0]}, whose cache has no static decode step (it works at every "
            "step outside any graph); drop it or choose another method"
        )


def check_trackers(report_to: list[str]) -> None:
    """Every tracker in ``report_to`` is known and installed (checked before the model loads, where
    transformers would fail only once training starts)."""
    from importlib.util import find_spec

    for name in report_to:
        if name not in TRACKERS:
            raise ValueError(f"unknown tracker {name!r} in report_to; choose from {sorted(TRACKERS)}")
        if not any(find_spec(module) for module in TRACKERS[name]):
            raise ValueError(
                f"report_to={name} needs the {TRACKERS[name][0]} package, which is not installed: "
                "pip install 'gkv-train[tracking]' (tensorboard and wandb)"
            )


@dataclass
class EvalConfig:
    """One evaluation call of ``scripts/evaluate.py``: a model, a dataset, and one or more compressions.

    ``methods`` x ``budgets`` (when given) sweep ``compression.method`` and ``compression.budget``; the other
    ``compression.*`` keys apply to every run.

    model: a built-in model (smollm2-135m, tiny), a hub name or a local folder / GGUF file.
    adapter: a LoRA adapter directory (e.g. a train.py output with lora.enabled=true).
    data: the problems.
    compression: the compression (with ``methods`` / ``budgets``: the options every run shares).
    methods: compression methods to sweep (full included as a run); None: compression.method alone.
    budgets: budgets to sweep for every compressing method; None: compression.budget alone.
    sampling: how completions are sampled (num_generations: samples per problem).
    batch_problems: problems per rollout batch (x sampling.num_generations sequences).
    precision: fp32 or bf16 (forwards under autocast).
    seed: seeds the sampling (each batch's seed follows from it and the batch's index).
    output_dir: the results' folder (evaluate.yaml: outputs/eval/<model>_<data>).
    overwrite: replace earlier results in output_dir made with other settings.
    plots: write pass_at_1_vs_budget.png and retained_density.png.
    """

    model: str = "smollm2-135m"
    adapter: str | None = None
    data: DataConfig = field(default_factory=lambda: DataConfig(split="test", limit=32))
    compression: CompressionConfig = field(default_factory=lambda: CompressionConfig("full"))
    methods: list[str] | None = None
    budgets: list[int] | None = None
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    batch_problems: int = 4
    precision: str = "fp32"
    seed: int = 0
    output_dir: str = "outputs/eval"
    overwrite: bool = False
    plots: bool = True

    def __post_init__(self):
        self.data.check("data")
        if self.batch_problems < 1:
            raise ValueError(f"batch_problems must be at least 1, got {self.batch_problems}")
        for key in ("methods", "budgets"):
            if getattr(self, key) is not None and not getattr(self, key):
                raise ValueError(f"{key}=[] names no run: give at least one, or leave {key} unset (null)")
        if self.budgets is not None and any(b < 1 for b in self.budgets):
            raise ValueError(f"budgets are token counts: each must be at least 1, got {list(self.budgets)}")
        check_compile_decode(self.sampling.compile_decode, self.compressions())
        for compression in self.compressions():
            compression.check_generation(self.sampling.max_new_tokens)
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; choose one of {PRECISIONS}")

    def run_settings(self, compression: CompressionConfig) -> dict:
        """Everything that determines one run's results: the model's and adapter's weights (``model_identity``),
        the data, the compression, sampling, batching (per-batch seeds), precision. Its fingerprint keys the run's
        folder."""
        from gkv_train.models import model_identity

        return {
            "model": model_identity(self.model),
            "adapter": None if self.adapter is None else model_identity(self.adapter),
            "data": self.data.identity(),
            "compression": compression_identity(compression),
            # "n_samples": the key of earlier identities, kept so that their results stay valid
            "sampling": dict(
                n_samples=self.sampling.num_generations,
                max_new_tokens=self.sampling.max_new_tokens,
                temperature=self.sampling.temperature,
                top_p=self.sampling.top_p,
                seed=self.seed,
            ),
            "batch_problems": self.batch_problems,
            "precision": self.precision,
        }

    def warnings(self) -> list[str]:
        """Settings that run but measure less than they seem to: an eviction interval longer than the
        completion, so the budget applies at most once (after the prompt) and never while generating."""
        found = []
        for run in self.compressions():
            if run.kind.rounds and run.settings.interval > self.sampling.max_new_tokens:
                found.append(
                    f"{run.method} budget {run.budget}: compression.interval={run.settings.interval} exceeds "
                    f"sampling.max_new_tokens={self.sampling.max_new_tokens}, so it compresses only after the "
                    "prompt, never while "
                    "generating (the training recipes use interval 16); set compression.interval to compare"
                )
        return found

    def compressions(self) -> list[CompressionConfig]:
        """Every compression to evaluate (validated)."""
        methods = self.methods or [self.compression.method]
        budgets = self.budgets or [self.compression.budget]
        runs = []
        for method in methods:
            for budget in [None] if method == "full" else budgets:
                runs.append(self.compression.for_method(method, budget))
        read = {key for run in runs for key in run.option_names()}
        unread = (
            [key for key in self.compression.unread() if key not in read] if self.compression.method == "full" else []
        )  # (another method's own configuration was checked when it was built)
        if unread:
            raise ValueError(f"compression.options.{unread[0]} applies to none of the runs ({', '.join(methods)})")
        return runs


# Keys of earlier versions: key -> where it is now (named in the error that refuses them)
MOVED = {
    **{
        key: f"sampling.{key}"
        for key in ("num_generations", "max_new_tokens", "temperature", "top_p", "compile_decode")
    },
    "n_samples": "sampling.num_generations",
    "samples_per_prompt": "sampling.num_generations",
    # a method's own options, once flat (compression.alpha), then grouped (compression.eviction.alpha,
    # compression.s4r.eta): refused with their new key for one release (0.1.x), then dropped
    **{
        f"compression{group}.{name}": f"compression.options.{name}"
        for group in ("", ".eviction", ".s4r")
        for name, _, _ in flat_fields()
        if name not in {f.name for f in dataclasses.fields(CompressionConfig)}
    },
}


def schema_keys(schema) -> set[str]:
    """Every dotted key of a config dataclass, nested groups included (``compression.budget``, ...)."""
    import typing

    keys = set()
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        keys.add(f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            keys |= {f"{f.name}.{sub}" for sub in schema_keys(hints[f.name])}
    return keys


# Hydra's own command-line flags (everything else with leading dashes is a key=value override written wrongly)
HYDRA_FLAGS = {
    "--help",
    "-h",
    "--hydra-help",
    "--version",
    "--cfg",
    "-c",
    "--resolve",
    "--package",
    "-p",
    "--info",
    "-i",
    "--run",
    "-r",
    "--multirun",
    "-m",
    "--shell-completion",
    "-sc",
    "--config-path",
    "-cp",
    "--config-name",
    "-cn",
    "--config-dir",
    "-cd",
    "--experimental-rerun",
}


def check_overrides(argv: list[str], schema) -> list[str]:
    """Command-line ``key=value`` overrides checked against ``schema`` before Hydra reads them; returns them, with
    ``data.name=null`` added where ``data.path`` (or ``eval_data.path``) is given without a name of its own (the
    built-in task is the default name, and a path and a name together are refused). Raises ValueError for:

    * ``--key=value`` / ``--key value`` (drop the dashes; Hydra's own flags pass);
    * a key of an earlier version (``MOVED``: ``max_new_tokens`` is ``sampling.max_new_tokens``), a GRPOConfig
      field this project sets from its own keys (``DERIVED``: ``bf16`` from ``precision``), ``trl.<field>`` (the
      fields are keys of their own), naming the key to write;
    * any other unknown key, with the closest known names ("did you mean").
    A method's option ``compression.options.<name>=value`` (checked by the method when the configuration is built)
    is passed on as ``++compression.options.<name>=value``: Hydra's way to set a key of a mapping the schema does
    not list. Hydra's own syntax (``+key``, ``~key``, ``hydra.*``) is left alone."""
    import difflib

    known = schema_keys(schema)
    options = "compression.options" in known
    known |= {f"compression.options.{name}" for name, _, _ in flat_fields()} if options else set()
    for i, arg in enumerate(argv):
        if arg.startswith("--") and arg.partition("=")[0] not in HYDRA_FLAGS:
            key, eq, value = arg[2:].partition("=")
            value = value if eq else (argv[i + 1] if i + 1 < len(argv) and "=" not in argv[i + 1] else "VALUE")
            raise ValueError(f"{arg}: drop the dashes, overrides are key=value (write {key}={value})")
    named = {arg.partition("=")[0] for arg in argv}
    for group in ("data", "eval_data"):
        if f"{group}.path" in named and f"{group}.name" not in named and f"{group}.path" in known:
            argv = [*argv, f"{group}.name=null"]
    for arg in argv:
        key, eq, value = arg.partition("=")
        if (
            not eq
            or key.startswith(("+", "~", "hydra."))
            or key in known
            or (options and key.startswith("compression.options."))
        ):
            continue
        if key in MOVED and MOVED[key] in known:
            raise ValueError(f"{key} is now {MOVED[key]}: write {MOVED[key]}={value}")
        if key in DERIVED and "prompts_per_step" in known:
            raise ValueError(f"{key} (TRL's) is not a key here: it is set from {DERIVED[key]}")
        if key.startswith("trl.") and key[4:] in known:
            raise ValueError(f"{key}: TRL's fields are keys of their own: write {key[4:]}={value}")
        close = difflib.get_close_matches(key, sorted(known | set(MOVED)), n=3, cutoff=0.6)
        close = list(dict.fromkeys(MOVED.get(name, name) for name in close))  # a moved key by its new name
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise ValueError(f"unknown configuration key {key!r}{hint}")
    return [f"++{arg}" if options and arg.startswith("compression.options.") else arg for arg in argv]


def apply_overrides(schema) -> None:
    """``check_overrides`` on this process's command line (before Hydra parses it); raises its ValueError."""
    import sys

    sys.argv[1:] = check_overrides(sys.argv[1:], schema)
