"""The option groups of the jobs (``rl``, ``distill``, ``lora``; the sampling keys, ``Sampling``) and the checks
of single values they use. Validated when built; no TRL import."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, fields
from typing import Any

from gkv_rollout.config import CompressionConfig, SamplingConfig

ALGORITHMS = ("grpo", "distill")
# TRL's GRPO losses; each is ratio x advantage, so truncated importance sampling (``rl.rollout_is``) applies
LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo")
IS_MODES = ("token_truncate", "sequence_truncate")
DISTILL_MODES = ("offline", "onpolicy")
DIVERGENCES = ("forward_kl", "sft")
PRECISIONS = ("fp32", "bf16")


def group(cls: type, **values) -> Any:
    """A group of a job's configuration (a dataclass field) whose default is ``cls(**values)``; ``values`` also kept
    in the field's metadata, so that the job's defaults are read without building its groups
    (``compose.job_defaults``)."""
    return field(default_factory=lambda: cls(**copy.deepcopy(values)), metadata={"group": (cls, values)})


def check_range(
    key: str, value, low=None, high=None, low_open: bool = False, high_open: bool = False, note: str = ""
) -> None:
    """``value`` (of the configuration key ``key``) a finite number within [low, high] (``low_open`` /
    ``high_open``: the bound itself excluded; None: unbounded); ValueError naming the key and the range."""
    below = low is not None and (value <= low if low_open else value < low)
    above = high is not None and (value >= high if high_open else value > high)
    if not math.isfinite(value) or below or above:
        if low is None and high is None:
            wanted = ""
        elif high is None:
            wanted = f" {'>' if low_open else '>='} {low}"
        elif low is None:
            wanted = f" {'<' if high_open else '<='} {high}"
        else:
            wanted = f" in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{key} must be a finite number{wanted}{note}, got {value}")


SEED_LIMIT = 2**63  # torch's random generators take 64 bits, and a job's batches add their index to its seed


def check_seed(key: str, seed: int) -> None:
    """A seed the random generators take, with room for each batch's index added to it: 0 <= ``seed`` < 2**63;
    ValueError naming the key."""
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(
            f"{key} must be an integer in [0, 2**63 - 1] (torch's random generators take 64 bits, and each batch adds "
            f"its index), got {seed}"
        )


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
    overlong_advantage_clip: clamp the advantage of completions that hit ``max_completion_length`` without a stop token
        to >= 0 (a departure from GRPO, off by default as in TRL: a cut completion may be reasoning that needed
        more tokens, so it is not punished; DAPO's overlong filtering, which leaves such completions out of the
        loss, is TRL's ``mask_truncated_completions``). A loop into the limit then costs a policy nothing while a
        cut completion that scored is still pushed up: on copy_recall RL-Sparse drifted into loops with it and
        scored 0.13 lower under G-KV over three seeds (docs/benchmarks/rl_evidence.md).
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
    overlong_advantage_clip: bool = False
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
        if not self.enabled:  # a LoRA setting without LoRA would be accepted and ignored
            defaults = LoraOptions(enabled=True)
            given = [f.name for f in fields(self) if getattr(self, f.name) != getattr(defaults, f.name)]
            if given != ["enabled"]:
                name = [n for n in given if n != "enabled"][0]
                raise ValueError(
                    f"lora.{name}={getattr(self, name)!r} applies to LoRA adapters, which are off: add "
                    "lora.enabled=true, or leave it out"
                )

    def settings(self) -> dict | None:
        """What a checkpoint's optimizer state depends on (None: no adapters), as its manifest records it."""
        return (
            {"r": self.r, "alpha": self.alpha, "target_modules": sorted(self.target_modules)} if self.enabled else None
        )


@dataclass
class Sampling:
    """How completions are sampled, under TRL's names (``GRPOConfig``'s fields): the keys ``num_generations``,
    ``max_completion_length``, ``temperature``, ``top_p`` of ``scripts/evaluate.py`` and
    ``scripts/generate_traces.py`` (their configurations' base); a training run has them as TRL's own fields.
    ``compile_decode`` and ``chunk_given`` are the rollout engine's. ``rollout_sampling`` turns any of these
    configurations into the engine's ``SamplingConfig``.

    num_generations: completions per prompt: GRPO's group size (>= 2), evaluation's samples per problem, traces'
        per problem.
    max_completion_length: the longest completion, in tokens.
    temperature: sampling temperature (0: greedy, an evaluation and traces setting; > 0 in training).
    top_p: nucleus sampling (log-probs are always those of the unclipped distribution).
    compile_decode: decode steps as compiled graphs (``SamplingConfig.compile_decode``; not with s4r).
    chunk_given: given tokens (a task's given beginning, replayed traces) up to each compression point in one
        forward (``SamplingConfig.chunk_given``); false: one token per forward.
    """

    num_generations: int = 4
    max_completion_length: int = 256
    temperature: float = 0.6
    top_p: float = 0.95
    compile_decode: bool = False
    chunk_given: bool = True


def check_sampling_keys(config, greedy: bool) -> None:
    """The sampling keys of a job's configuration (``Sampling``'s fields, or a training run's TRL fields of the
    same names; distillation has no ``num_generations``): ``check_sampling``, at least one completion of at
    least one token, the engine's switches true or false; ValueError naming the key."""
    check_sampling(config.temperature, config.top_p, greedy)
    for name in ("compile_decode", "chunk_given"):
        if not isinstance(getattr(config, name), bool):
            raise ValueError(f"{name} must be true or false, got {getattr(config, name)!r}")
    for name in ("num_generations", "max_completion_length")[0 if hasattr(config, "num_generations") else 1 :]:
        if getattr(config, name) is None or getattr(config, name) < 1:  # (None: TRL's type allows it)
            raise ValueError(f"{name} must be at least 1, got {getattr(config, name)}")


def rollout_sampling(config, seed: int, num_samples: int | None = None) -> SamplingConfig:
    """The rollout engine's ``SamplingConfig`` from a job's sampling keys (``Sampling``'s fields, or a training
    run's TRL fields of the same names): ``num_samples`` completions per prompt (None: ``num_generations``),
    seeded with ``seed``."""
    return SamplingConfig(
        max_new_tokens=config.max_completion_length,
        temperature=config.temperature,
        top_p=config.top_p,
        num_samples=config.num_generations if num_samples is None else num_samples,
        seed=seed,
        compile_decode=config.compile_decode,
        chunk_given=config.chunk_given,
    )


# the recipes (recipes/recipe/*.yaml) -> the algorithm they train with (and distillation's mode)
RECIPE_ALGORITHMS = {
    "rl_sparse": "grpo",
    "sparse_rl": "grpo",
    "rl_full": "grpo",
    "distill": "distill",
    "distill_onpolicy": "distill",
}
RECIPE_MODES = {"distill": "offline", "distill_onpolicy": "onpolicy"}


def check_recipe_algorithm(recipe: str, algorithm: str) -> None:
    """``recipe`` is a known recipe (``RECIPE_ALGORITHMS``) that trains with ``algorithm``; ValueError naming the
    recipes of ``algorithm`` otherwise."""
    if recipe not in RECIPE_ALGORITHMS:
        raise ValueError(f"unknown recipe {recipe!r}; choose one of {', '.join(RECIPE_ALGORITHMS)}")
    if RECIPE_ALGORITHMS[recipe] != algorithm:
        own = " or ".join(f"recipe={name}" for name, kind in RECIPE_ALGORITHMS.items() if kind == algorithm)
        raise ValueError(
            f"recipe={recipe} trains with algorithm={RECIPE_ALGORITHMS[recipe]}, but algorithm={algorithm}: the run "
            f"would be recorded as a recipe it is not; choose {own} (each sets its algorithm), or drop algorithm"
        )


def check_recipe(recipe: str, algorithm: str, compression: CompressionConfig, rl=None, mode: str | None = None) -> None:
    """The recipe a run records (``recipe``, written into its eval.json and configuration) is the one that runs: a
    known recipe (``RECIPE_ALGORITHMS``) trained with its ``algorithm``, distillation in its ``mode``, GRPO's compressed
    recipes (rl_sparse, sparse_rl) with a compressing method (with ``compression.method=full`` the run is rl_full).
    ``recipe=rl_full`` (full-cache rollouts, full-attention training) with a compressing method contradicts itself
    unless ``rl.train_with_record=false`` asks for a dense learner on compressed rollouts (a baseline). ValueError
    naming the recipe that would run."""
    check_recipe_algorithm(recipe, algorithm)
    if recipe in RECIPE_MODES and RECIPE_MODES[recipe] != mode:
        other = next(name for name, kind in RECIPE_MODES.items() if kind == mode)
        raise ValueError(
            f"recipe={recipe} distils {RECIPE_MODES[recipe]}, but distill.mode={mode}: that run is recipe={other}"
        )
    if recipe in ("rl_sparse", "sparse_rl") and not compression.compresses:
        raise ValueError(
            f"recipe={recipe} trains on compressed rollouts, but compression.method={compression.method} compresses "
            "nothing: that run is recipe=rl_full (full-cache rollouts, full-attention training); use recipe=rl_full"
        )
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
    compile_decode: bool, compressions: list[CompressionConfig], key: str = "compile_decode"
) -> None:
    """``compile_decode`` (the option ``key``) only with caches that have a static decode step
    (``Method.static_decode``); raises ValueError."""
    dynamic = [c.method for c in compressions if not c.kind.static_decode]
    if compile_decode and dynamic:
        raise ValueError(
            f"{key}=true does not apply to {dynamic[0]}, whose cache has no static decode step (it works at every "
            "step outside any graph); drop it or choose another method"
        )


def wandb_login() -> str | None:
    """Where Weights & Biases would find this run's credentials, as wandb looks (its environment variables, the
    ``.netrc`` entry of its host, its settings file), or what makes it need none (``WANDB_MODE`` offline or disabled);
    None when it would find nothing."""
    import netrc
    import os
    from pathlib import Path
    from urllib.parse import urlparse

    if os.environ.get("WANDB_MODE", "") in ("offline", "disabled", "dryrun"):
        return f"WANDB_MODE={os.environ['WANDB_MODE']}"
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        if os.environ.get(name):
            return name
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        if netrc.netrc(path).authenticators(host):
            return str(path)
    except (OSError, netrc.NetrcParseError):
        pass
    settings = Path(os.environ.get("WANDB_CONFIG_DIR") or Path.home() / ".config" / "wandb") / "settings"
    try:
        return str(settings) if "api_key" in settings.read_text() else None
    except OSError:
        return None


def check_trackers(report_to: list[str]) -> None:
    """Every tracker in ``report_to`` is known and installed, and W&B has a login (checked before the model loads,
    where transformers would fail only once training starts)."""
    from importlib.util import find_spec

    for name in report_to:
        if name not in TRACKERS:
            raise ValueError(f"unknown tracker {name!r} in report_to; choose from {sorted(TRACKERS)}")
        if not any(find_spec(module) for module in TRACKERS[name]):
            raise ValueError(
                f"report_to={name} needs the {TRACKERS[name][0]} package, which is not installed: "
                "pip install 'gkv-train[tracking]' (tensorboard and wandb)"
            )
        if name == "wandb" and wandb_login() is None:
            raise ValueError(
                "report_to=wandb needs a Weights & Biases login, and none is found (WANDB_API_KEY, wandb login's "
                ".netrc entry): run wandb login, set WANDB_API_KEY, or log offline with WANDB_MODE=offline"
            )
