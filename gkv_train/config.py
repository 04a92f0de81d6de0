"""The structured configuration of ``train.py`` (Hydra), validated at start-up.

Keys shared with the evaluation script: ``model``, ``data.path`` / ``data.name``, ``data.question_field``,
``data.answer_field``, ``compression.method`` and its parameters (``compression.budget``, ...),
``max_new_tokens``, ``temperature``, ``top_p``, ``seed``.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from gkv_train.distill import DistillOptions
from rollout.config import CompressionConfig

ALGORITHMS = ("grpo", "distill")
LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo")
PRECISIONS = ("fp32", "bf16")
PROMPT_TEMPLATE = "{problem}\nPut your final answer in \\boxed{{}}."


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


def check_sampling(temperature: float, top_p: float, greedy: bool) -> None:
    """Sampling settings: a finite ``temperature`` > 0 (>= 0 when ``greedy`` decoding is allowed, i.e. in
    evaluation) and 0 < ``top_p`` <= 1; raises ValueError naming the problem."""
    lowest = 0 <= temperature if greedy else 0 < temperature
    if not (math.isfinite(temperature) and lowest):
        need = ">= 0 (0: greedy)" if greedy else "> 0 in training (greedy decoding, temperature=0, is an evaluation setting)"
        raise ValueError(f"temperature must be a finite number {need}, got {temperature}")
    if not (math.isfinite(top_p) and 0 < top_p <= 1):
        raise ValueError(f"top_p must lie in (0, 1], got {top_p}")


@dataclass
class DataConfig:
    """Where problems come from: ``path`` (local JSONL/JSON/Parquet) or ``name`` (preset: aime24, amc23,
    math500, gsm8k, svamp; ``arithmetic``, the built-in task; or a hub dataset)."""

    path: str | None = None
    name: str | None = "arithmetic"
    question_field: Any = "question"  # a field, or a list of fields joined with a space
    answer_field: str = "answer"
    split: str = "train"
    limit: int | None = 256
    levels: list[int] = field(default_factory=lambda: [1])  # built-in task difficulty levels (1-4)
    prompt_template: str = PROMPT_TEMPLATE

    def identity(self) -> dict:
        """Everything that determines the problems and prompts: these settings and, for a local file (or a
        preset's), the file's identity (path, size, modification time)."""
        from gkv_train.data import local_file
        from gkv_train.jsonio import file_identity

        file = local_file(self.path, self.name)
        return {**asdict(self), "file": file_identity(file) if file is not None and file.is_file() else None}


@dataclass
class LoraOptions:
    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class TrainConfig:
    """One training run. ``recipe=rl_sparse`` / ``rl_full`` set the compression and the masks."""

    recipe: str = "rl_sparse"
    algorithm: str = "grpo"  # grpo | distill
    model: str = "smollm2-135m"
    data: DataConfig = field(default_factory=DataConfig)
    eval_data: DataConfig = field(default_factory=lambda: DataConfig(split="test", limit=32))
    compression: CompressionConfig = field(
        default_factory=lambda: CompressionConfig("gkv", budget=64, window=8, interval=16)
    )
    train_with_record: bool = True  # rl_sparse: attend under the rollout's record; False drops the masks
    # GRPO
    prompts_per_step: int = 2
    samples_per_prompt: int = 8
    max_new_tokens: int = 96
    temperature: float = 0.6
    top_p: float = 0.95
    loss_type: str = "dapo"
    beta: float = 0.0
    epsilon: float = 0.2
    epsilon_high: float = 0.28
    scale_rewards: str = "group"
    rewards: list[str] = field(default_factory=lambda: ["rewards.functions.accuracy"])
    reward_weights: list[float] | None = None
    overlong_advantage_clip: bool = True
    rollout_is: str | None = None  # token_truncate | sequence_truncate
    rollout_is_cap: float = 2.0
    use_vllm: bool = False  # rl_full on a GPU with the vllm extra: generate through TRL's vLLM integration
    # distillation (algorithm=distill); prompts_per_step is then the number of traces / prompts per step
    distill_mode: str = "offline"  # offline (teacher traces, replayed) | onpolicy (student samples)
    divergence: str = "forward_kl"  # forward_kl (at temperature, x T^2) | sft
    teacher: str | None = None  # default: a frozen copy of the initial model
    traces: str | None = None  # a traces JSONL (scripts/generate_traces.py); None: generated at start
    trace_problems: int = 64
    trace_samples: int = 4
    # optimisation
    max_steps: int = 6
    learning_rate: float = 2e-6
    lr_scheduler_type: str = "constant"
    warmup_steps: float = 0  # steps, or a fraction of max_steps when < 1
    gradient_accumulation_steps: int = 1
    max_grad_norm: float = 1.0
    precision: str = "fp32"
    gradient_checkpointing: bool = False
    lora: LoraOptions = field(default_factory=LoraOptions)
    mask_backend: str = "auto"
    # bookkeeping
    output_dir: str = "outputs/rl_sparse"
    save_steps: int = 1
    eval_steps: int | None = None  # also evaluate on eval_data every N steps (TRL's GRPO evaluation)
    save_total_limit: int | None = 2
    logging_steps: int = 1
    report_to: list[str] = field(default_factory=list)
    eval_samples: int = 1  # completions per held-out problem in the final evaluation
    seed: int = 0
    resume: str | None = None  # a checkpoint directory, or "last" for the newest complete one in output_dir
    overwrite: bool = False  # replace a previous run in output_dir (otherwise refused unless resume is given)

    def __post_init__(self):
        check_sampling(self.temperature, self.top_p, greedy=False)
        if self.overwrite and self.resume is not None:
            raise ValueError(f"overwrite=true and resume={self.resume} contradict each other: choose one")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}; choose one of {ALGORITHMS}")
        if self.algorithm == "distill":
            DistillOptions(mode=self.distill_mode, divergence=self.divergence, temperature=self.temperature)
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"unknown loss_type {self.loss_type!r}; choose one of {LOSS_TYPES}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; choose one of {PRECISIONS}")
        for name in ("prompts_per_step", "samples_per_prompt", "max_new_tokens", "max_steps", "save_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.algorithm == "grpo" and self.samples_per_prompt < 2:
            raise ValueError("samples_per_prompt must be at least 2: GRPO compares samples of one prompt")
        if self.use_vllm and self.compression.compresses:
            raise ValueError("use_vllm generates with a full cache: it is only for rl_full (compression.method=full)")
        if self.reward_weights is not None and len(self.reward_weights) != len(self.rewards):
            raise ValueError(f"{len(self.reward_weights)} reward_weights for {len(self.rewards)} rewards")


@dataclass
class EvalConfig:
    """One evaluation call of ``scripts/evaluate.py``: a model, a dataset, and one or more compressions.

    ``methods`` x ``budgets`` (when given) sweep ``compression.method`` and ``compression.budget``; the other
    ``compression.*`` keys apply to every run.
    """

    model: str = "smollm2-135m"
    adapter: str | None = None  # a LoRA adapter directory (e.g. a train.py output with lora.enabled=true)
    data: DataConfig = field(default_factory=lambda: DataConfig(split="test", limit=32))
    compression: CompressionConfig = field(default_factory=lambda: CompressionConfig("full"))
    methods: list[str] | None = None
    budgets: list[int] | None = None
    n_samples: int = 4
    max_new_tokens: int = 256
    temperature: float = 0.6
    top_p: float = 0.95
    batch_problems: int = 4  # problems per rollout batch (x n_samples sequences)
    precision: str = "fp32"
    seed: int = 0
    output_dir: str = "outputs/eval"  # evaluate.yaml: outputs/eval/<model>_<data>
    overwrite: bool = False  # replace earlier results in output_dir made with other settings
    plots: bool = True

    def __post_init__(self):
        check_sampling(self.temperature, self.top_p, greedy=True)
        if self.n_samples < 1 or self.max_new_tokens < 1 or self.batch_problems < 1:
            raise ValueError("n_samples, max_new_tokens and batch_problems must be at least 1")
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
            "compression": asdict(compression.resolved()),
            "sampling": dict(n_samples=self.n_samples, max_new_tokens=self.max_new_tokens,
                             temperature=self.temperature, top_p=self.top_p, seed=self.seed),
            "batch_problems": self.batch_problems,
            "precision": self.precision,
        }

    def compressions(self) -> list[CompressionConfig]:
        """Every compression to evaluate (validated)."""
        base = asdict(self.compression)
        methods = self.methods or [self.compression.method]
        budgets = self.budgets or [self.compression.budget]
        runs = []
        for method in methods:
            for budget in [None] if method == "full" else budgets:
                runs.append(CompressionConfig(**{**base, "method": method, "budget": budget or base["budget"]}))
        return runs
