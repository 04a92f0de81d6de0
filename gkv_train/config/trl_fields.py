"""TRL's ``GRPOConfig`` as keys of the training configuration: which of its fields are keys (``trl_fields``; the
others are set from the project's keys, ``DERIVED``), the defaults this project changes and why
(``PROJECT_DEFAULTS``), the values TRL checks only once the trainer is built (``TRL_AT_LEAST``, ``TRL_CHOICES``),
and the fields of TRL's own generation that the rollout engine has not (``ENGINE_IGNORES``). TRL is imported only
when the fields are read (evaluation and traces never do)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# GRPOConfig / TrainingArguments fields set from this project's keys, so not keys of their own: field -> what sets it
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
# GRPOConfig fields whose default here differs from TRL's: field -> (default, why)
PROJECT_DEFAULTS = {
    "learning_rate": (2e-6, "RL-scale updates on the 135M default"),
    "lr_scheduler_type": ("constant", "short runs compare recipes at one rate"),
    "max_steps": (6, "a CPU-scale run; set it for real runs"),
    "save_steps": (1, "a complete checkpoint every step: no work lost on a kill"),
    "save_total_limit": (2, "the newest two checkpoints"),
    "logging_steps": (1, "every step's metrics in metrics.jsonl"),
    "seed": (0, "this project's seed everywhere"),
    "max_completion_length": (96, "a CPU-scale completion; set it for real runs"),
    "temperature": (0.6, "the recipes' measured sampling"),
    "top_p": (0.95, "the recipes' measured sampling"),
    "num_generations": (8, "pinned, the recipes' measured group size"),
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


def trl_fields(own: set[str]) -> dict[str, TrlField]:
    """GRPOConfig's fields that are keys of the training configuration: all but the project's ``own`` keys,
    ``DERIVED`` (set from the project's keys) and private ones; the defaults of ``PROJECT_DEFAULTS`` with their
    reason in the help."""
    import enum
    import typing

    from trl import GRPOConfig

    hints = typing.get_type_hints(GRPOConfig)
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


def trl_arguments(fields: dict[str, TrlField]) -> type:
    """A dataclass of TRL's fields ``fields`` (their schema types; TRL's own type and help in each field's
    metadata): the base that gives the training configuration TRL's keys under their own names."""
    import copy

    declared = []
    for key, trl in fields.items():
        value = trl.default_value
        metadata = {"help": trl.help, "type": trl.kind}
        if isinstance(value, (list, dict)):
            default = field(default_factory=lambda v=value: copy.deepcopy(v), metadata=metadata)
        else:
            default = field(default=value, metadata=metadata)
        declared.append((key, _schema_type(trl.kind), default))
    arguments = dataclasses.make_dataclass("TrlArguments", declared)
    arguments.__module__ = __name__
    arguments.__doc__ = "TRL's GRPOConfig fields, generated from the installed TRL (``trl_fields``)."
    return arguments
