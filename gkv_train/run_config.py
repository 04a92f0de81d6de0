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

from gkv_train.data import DataConfig
from gkv_rollout.config import CompressionConfig

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
        need = ">= 0 (0: greedy)" if greedy else "> 0 in training (greedy decoding, temperature=0, is an evaluation setting)"
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
    dropout: dropout on the adapters' input.
    target_modules: the linear layers that get adapters.
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
class TrainConfig:
    """One training run. ``recipe=rl_sparse`` / ``rl_full`` set the compression and the masks.

    recipe: the recipe (recipes/recipe/*.yaml): rl_sparse, rl_full, sparse_rl, distill, distill_onpolicy.
    model: a built-in model (smollm2-135m, tiny), a hub name or a local folder / GGUF file.
    prompts_per_step: GRPO: distinct prompts per optimizer step (rows: x num_generations); distillation: rows.
    num_generations: GRPO group size: completions sampled per prompt (TRL's name).
    max_new_tokens: the longest completion (TRL: max_completion_length).
    temperature: sampling temperature of the rollouts (> 0 in training).
    top_p: nucleus sampling of the rollouts (log-probs are always of the unclipped distribution).
    loss_type: TRL's GRPO loss (dapo, grpo, dr_grpo, bnpo, ...).
    beta: KL coefficient against the reference model (0: no reference model).
    epsilon: PPO clip range, lower side.
    epsilon_high: PPO clip range, upper side (DAPO's clip-higher).
    scale_rewards: TRL's advantage scaling: group, batch or none.
    rewards: reward functions by import path (plain callables, TRL's signature).
    reward_weights: one weight per reward function (None: all 1).
    max_steps: optimizer steps.
    learning_rate: the optimizer's learning rate.
    lr_scheduler_type: transformers' scheduler name (constant, linear, cosine, ...).
    gradient_accumulation_steps: micro-batches per optimizer step, per process.
    max_grad_norm: gradient clipping norm.
    precision: fp32 or bf16 (bf16: forwards under autocast, weights kept fp32; under accelerate launch, follows
        its mixed precision when not given).
    gradient_checkpointing: recompute activations in the backward (memory for time).
    mask_backend: how training forwards attend under the record: auto, flex (FlexAttention block masks) or sdpa.
    output_dir: the run's folder (checkpoints, metrics.jsonl, train.log, eval.json).
    save_steps: checkpoint every N steps (and at the end).
    save_total_limit: checkpoints kept (None: all).
    logging_steps: log metrics every N steps.
    trl: TRL GRPOConfig / TrainingArguments fields without a key here, passed as is (``trl.weight_decay=0.01``,
        or top-level ``weight_decay=0.01``).
    seed: seeds the trainer, the data order and the rollouts.
    """

    recipe: str = "rl_sparse"
    algorithm: str = "grpo"  # grpo | distill
    model: str = "smollm2-135m"
    data: DataConfig = field(default_factory=DataConfig)
    eval_data: DataConfig = field(default_factory=lambda: DataConfig(split="test", limit=32))
    compression: CompressionConfig = field(
        default_factory=lambda: CompressionConfig("gkv", budget=64, window=8, interval=16)
    )
    # GRPO
    prompts_per_step: int = 2
    num_generations: int = 8
    max_new_tokens: int = 96
    temperature: float = 0.6
    top_p: float = 0.95
    compile_decode: bool = False  # rollout decode steps as compiled graphs (SamplingConfig.compile_decode)
    loss_type: str = "dapo"
    beta: float = 0.0
    epsilon: float = 0.2
    epsilon_high: float = 0.28
    scale_rewards: str = "group"
    rewards: list[str] = field(default_factory=lambda: ["gkv_rewards.functions.accuracy"])
    reward_weights: list[float] | None = None
    rl: SparseRLOptions = field(default_factory=SparseRLOptions)
    use_vllm: bool = False  # rl_full on a GPU with the vllm extra: generate through TRL's vLLM integration
    # distillation (algorithm=distill); prompts_per_step is then the number of traces / prompts per step
    distill: DistillOptions = field(default_factory=DistillOptions)
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
    report_to: list[str] = field(default_factory=list)  # trackers (TRACKERS): e.g. [tensorboard], [wandb]
    # TRL's GRPOConfig (distillation: transformers' TrainingArguments) fields without a key here, handed to the
    # trainer as is: weight_decay, num_iterations, log_completions, push_to_hub, ... (train.py takes them as
    # top-level keys too: weight_decay=0.01 becomes trl.weight_decay=0.01)
    trl: dict[str, Any] = field(default_factory=dict)
    run_name: str | None = None  # the run's name in the trackers (default: the output folder)
    eval_samples: int = 1  # completions per held-out problem in the final evaluation
    seed: int = 0
    resume: str | None = None  # a checkpoint directory, or "last" for the newest complete one in output_dir
    overwrite: bool = False  # replace a previous run in output_dir (otherwise refused unless resume is given)

    def __post_init__(self):
        self.data.check("data")
        self.eval_data.check("eval_data")
        check_sampling(self.temperature, self.top_p, greedy=False)
        check_trackers(self.report_to)
        if self.overwrite and self.resume is not None:
            raise ValueError(f"overwrite=true and resume={self.resume} contradict each other: choose one")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}; choose one of {ALGORITHMS}")
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"unknown loss_type {self.loss_type!r}; choose one of {LOSS_TYPES}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; choose one of {PRECISIONS}")
        for name in ("prompts_per_step", "num_generations", "max_new_tokens", "max_steps", "save_steps",
                     "gradient_accumulation_steps", "logging_steps", "eval_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("eval_steps", "save_total_limit"):  # None: off / no limit
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 or null, got {getattr(self, name)}")
        check_range("learning_rate", self.learning_rate, low=0, low_open=True)
        check_range("warmup_steps", self.warmup_steps, low=0)
        check_range("max_grad_norm", self.max_grad_norm, low=0, note=" (0 turns gradient clipping off)")
        check_range("beta", self.beta, low=0, note=" (the KL weight; 0: no reference model)")
        check_range("epsilon", self.epsilon, low=0, low_open=True)
        check_range("epsilon_high", self.epsilon_high, low=0, low_open=True)
        if self.reward_weights is not None:
            for weight in self.reward_weights:
                check_range("reward_weights", weight)
        check_recipe(self.recipe, self.compression, self.rl)
        if self.algorithm == "grpo" and self.num_generations < 2:
            raise ValueError("num_generations must be at least 2: GRPO compares samples of one prompt")
        check_compile_decode(self.compile_decode, [self.compression])
        if self.use_vllm and self.compile_decode:
            raise ValueError("use_vllm generates through vLLM: compile_decode=true (the engine's option) has no effect")
        if self.use_vllm and self.compression.compresses:
            raise ValueError("use_vllm generates with a full cache: it is only for rl_full (compression.method=full)")
        if self.reward_weights is not None and len(self.reward_weights) != len(self.rewards):
            raise ValueError(f"{len(self.reward_weights)} reward_weights for {len(self.rewards)} rewards")


@dataclass
class TracesConfig:
    """One call of ``scripts/generate_traces.py``: full-cache completions of a teacher, checked; the correct ones
    (``keep_incorrect``: all) written as JSONL for offline distillation (``distill.traces``).

    max_new_tokens: the longest completion.
    temperature: sampling temperature (0: greedy).
    top_p: nucleus sampling.
    seed: seeds the sampling.
    output: the traces file (JSONL); refused when another job writes it.
    """

    model: str = "smollm2-135m"  # the teacher
    data: DataConfig = field(default_factory=lambda: DataConfig(limit=64))
    num_generations: int = 4  # completions per problem
    max_new_tokens: int = 256
    temperature: float = 0.6
    top_p: float = 0.95
    seed: int = 0
    keep_incorrect: bool = False  # write wrong completions too
    compile_decode: bool = False  # decode steps as compiled graphs (SamplingConfig.compile_decode)
    output: str = "outputs/traces.jsonl"

    def __post_init__(self):
        self.data.check("data")
        check_sampling(self.temperature, self.top_p, greedy=True)
        if self.num_generations < 1 or self.max_new_tokens < 1:
            raise ValueError("num_generations and max_new_tokens must be at least 1")


# CompressionConfig fields added after results were first keyed by settings: left out of a run's identity while
# the run behaves as before they existed (s4r without refresh, whatever refresh_rank says), so earlier results
# stay valid
LATER_COMPRESSION_FIELDS = ("refresh", "refresh_rank")


def compression_identity(compression: CompressionConfig) -> dict:
    """The resolved compression settings that determine a run's results (``LATER_COMPRESSION_FIELDS`` left out
    when refresh is off)."""
    settings = asdict(compression.resolved())
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


def check_compile_decode(compile_decode: bool, compressions: list[CompressionConfig]) -> None:
    """``compile_decode`` only with caches that have a static decode step (not s4r); raises ValueError."""
    if compile_decode and any(c.method == "s4r" for c in compressions):
        raise ValueError("compile_decode=true does not apply to s4r, which scores and reconstructs at every step "
                         "outside any graph; drop it or choose another method")


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
    methods: compression methods to sweep (full included as a run); None: compression.method alone.
    budgets: budgets to sweep for every compressing method; None: compression.budget alone.
    max_new_tokens: the longest completion.
    temperature: sampling temperature (0: greedy).
    top_p: nucleus sampling.
    precision: fp32 or bf16 (forwards under autocast).
    seed: seeds the sampling (each batch's seed follows from it and the batch's index).
    plots: write pass_at_1_vs_budget.png and retained_density.png.
    """

    model: str = "smollm2-135m"
    adapter: str | None = None  # a LoRA adapter directory (e.g. a train.py output with lora.enabled=true)
    data: DataConfig = field(default_factory=lambda: DataConfig(split="test", limit=32))
    compression: CompressionConfig = field(default_factory=lambda: CompressionConfig("full"))
    methods: list[str] | None = None
    budgets: list[int] | None = None
    num_generations: int = 4  # samples per problem (TRL's name; n_samples is an alias)
    max_new_tokens: int = 256
    temperature: float = 0.6
    top_p: float = 0.95
    batch_problems: int = 4  # problems per rollout batch (x num_generations sequences)
    compile_decode: bool = False  # decode steps as compiled graphs (SamplingConfig.compile_decode)
    precision: str = "fp32"
    seed: int = 0
    output_dir: str = "outputs/eval"  # evaluate.yaml: outputs/eval/<model>_<data>
    overwrite: bool = False  # replace earlier results in output_dir made with other settings
    plots: bool = True

    def __post_init__(self):
        self.data.check("data")
        check_sampling(self.temperature, self.top_p, greedy=True)
        if self.num_generations < 1 or self.max_new_tokens < 1 or self.batch_problems < 1:
            raise ValueError("num_generations, max_new_tokens and batch_problems must be at least 1")
        for key in ("methods", "budgets"):
            if getattr(self, key) is not None and not getattr(self, key):
                raise ValueError(f"{key}=[] names no run: give at least one, or leave {key} unset (null)")
        if self.budgets is not None and any(b < 1 for b in self.budgets):
            raise ValueError(f"budgets are token counts: each must be at least 1, got {list(self.budgets)}")
        check_compile_decode(self.compile_decode, self.compressions())
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
            "sampling": dict(n_samples=self.num_generations, max_new_tokens=self.max_new_tokens,
                             temperature=self.temperature, top_p=self.top_p, seed=self.seed),
            "batch_problems": self.batch_problems,
            "precision": self.precision,
        }

    def warnings(self) -> list[str]:
        """Settings that run but measure less than they seem to: an eviction interval longer than the
        completion, so the budget applies at most once (after the prompt) and never while generating."""
        found = []
        for run in self.compressions():
            resolved = run.resolved()
            if resolved.compresses and run.method != "s4r" and resolved.interval > self.max_new_tokens:
                found.append(
                    f"{run.method} budget {run.budget}: compression.interval={resolved.interval} exceeds "
                    f"max_new_tokens={self.max_new_tokens}, so it compresses only after the prompt, never while "
                    "generating (the training recipes use interval 16); set compression.interval to compare"
                )
        return found

    def compressions(self) -> list[CompressionConfig]:
        """Every compression to evaluate (validated)."""
        base = asdict(self.compression)
        methods = self.methods or [self.compression.method]
        budgets = self.budgets or [self.compression.budget]
        runs = []
        for method in methods:
            for budget in [None] if method == "full" else budgets:
                runs.append(CompressionConfig(**{**base, "method": method, "budget": budget}))
        return runs


# TRL's (and earlier) names for keys that have another canonical name here: alias -> canonical key.
ALIASES = {
    "max_completion_length": "max_new_tokens",  # TRL
    "bf16": "precision",  # TRL: bf16=true -> precision=bf16, bf16=false -> precision=fp32
    "samples_per_prompt": "num_generations",  # this project's earlier name
    "n_samples": "num_generations",  # evaluate.py's earlier name
}
# GRPOConfig / TrainingArguments fields this project sets from its own keys (not passed through ``trl``).
DERIVED = {
    "per_device_train_batch_size": "rows per step are prompts_per_step x num_generations (per process: divided by "
    "processes x gradient_accumulation_steps); set prompts_per_step",
    "per_device_eval_batch_size": "set from prompts_per_step x num_generations",
    "use_cpu": "set when no GPU is present", "eval_strategy": "set by eval_steps",
    "save_strategy": "checkpoints every save_steps", "activation_checkpointing": "set gradient_checkpointing",
    "fp16": "set precision (fp32 or bf16)",
}


def schema_keys(schema) -> set[str]:
    """Every dotted key of a config dataclass, nested groups included (``compression.budget``, ...)."""
    import dataclasses
    import typing

    keys = set()
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        keys.add(f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            keys |= {f"{f.name}.{sub}" for sub in schema_keys(hints[f.name])}
    return keys


def trainer_fields(algorithm: str = "grpo") -> set[str]:
    """The fields of TRL's ``GRPOConfig`` (GRPO) or transformers' ``TrainingArguments`` (distillation)."""
    import dataclasses

    if algorithm == "grpo":
        from trl import GRPOConfig as args_class
    else:
        from transformers import TrainingArguments as args_class
    return {f.name for f in dataclasses.fields(args_class)}


# Hydra's own command-line flags (everything else with leading dashes is a key=value override written wrongly)
HYDRA_FLAGS = {"--help", "-h", "--hydra-help", "--version", "--cfg", "-c", "--resolve", "--package", "-p", "--info",
               "-i", "--run", "-r", "--multirun", "-m", "--shell-completion", "-sc", "--config-path", "-cp",
               "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun"}  # fmt: skip


def translate_overrides(argv: list[str], schema, passthrough: bool) -> tuple[list[str], list[str]]:
    """Command-line ``key=value`` overrides as Hydra should read them, and notes for the user.

    * an alias (``ALIASES``: TRL's ``max_completion_length``, ``bf16``; earlier names) becomes its canonical key,
      with a note;
    * with ``passthrough`` (train.py), a field of TRL's ``GRPOConfig`` that has no key here (``weight_decay``,
      ``num_iterations``, ``log_completions``, ``push_to_hub``, ...) goes to the ``trl`` group, which is handed to
      the trainer's arguments as is; one that this project derives from its own keys (``DERIVED``) is an error
      that names them;
    * any other unknown key is an error with the closest known names ("did you mean");
    * ``--key=value`` / ``--key value`` is an error that says to drop the dashes (Hydra's own flags pass);
    * ``report_to=wandb`` (a string) is read as the list ``report_to=[wandb]``;
    * ``data.path=...`` (or ``eval_data.path``) without a ``.name`` of its own implies ``data.name=null`` (the
      built-in task is the default name, and a path and a name together are refused).
    Hydra's own syntax (``+key``, ``~key``, ``hydra.*``) is left alone."""
    import difflib

    known = schema_keys(schema)
    out, notes = [], []
    trl_fields: set[str] | None = None
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
        if key == "report_to" and eq and not value.strip().startswith("["):
            arg = f"report_to=[{value}]"
        if not eq or key.startswith(("+", "~", "hydra.")) or key in known:
            out.append(arg)
            continue
        if key.startswith("trl."):  # a new key of the trl group: Hydra wants it prefixed
            out.append(f"+{arg}")
            continue
        if key in ALIASES and ALIASES[key] in known:
            canonical, read = ALIASES[key], value
            if key == "bf16":
                read = "bf16" if value.strip().lower() in ("true", "1", "yes") else "fp32"
            notes.append(f"{arg} is read as {canonical}={read} ({canonical} is the name used here; {key} is an alias)")
            out.append(f"{canonical}={read}")
            continue
        if passthrough:
            trl_fields = trainer_fields() if trl_fields is None else trl_fields
            if key in DERIVED:
                raise ValueError(f"{key} is not set directly here: {DERIVED[key]}")
            if key in trl_fields:
                out.append(f"+trl.{key}={value}")
                continue
        candidates = known | set(ALIASES) | (trl_fields or set())
        close = difflib.get_close_matches(key, sorted(candidates), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise ValueError(f"unknown configuration key {key!r}{hint}")
    return out, notes


def apply_overrides(schema, passthrough: bool) -> None:
    """``translate_overrides`` on this process's command line (before Hydra parses it): notes go to stderr; an
    unknown key raises its ValueError."""
    import sys

    sys.argv[1:], notes = translate_overrides(sys.argv[1:], schema, passthrough)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
