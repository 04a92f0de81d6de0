"""TRL's, transformers' and PEFT's own fields of a training configuration (``GRPOTrainConfig``,
``DistillTrainConfig``), checked when it is built, before any model loads.

* ``check_honoured`` (the values as given): a field this project does not honour (the trainer would accept and
  ignore it, or apply it on a path the project replaces), given away from its default, is refused naming what to
  use; so is a file a field names that does not hold what it must (``deepspeed``).
* ``check_as_trainer_would`` (once TRL's and transformers' ``__post_init__`` ran): the checks TRL and transformers
  make only when the trainer is built or the first rollout has run: choices, ranges, the installs a field needs
  (vLLM, Liger, an optimizer's package: transformers' own lookup), a schedule's own arguments.
* ``precision_from_launcher`` (the command line, before it is composed): accelerate's mixed precision and the run's
  ``precision`` agree.

The fields come from the classes and functions themselves where they can: the fields transformers leaves to
training scripts (its help: "not directly used by Trainer"), TRL's vLLM and Hub fields by name, a schedule's
arguments from its function's signature, the optimizer's package from transformers' ``get_optimizer_cls_and_kwargs``;
the rest are listed here with the reason they are not honoured (``NOT_HONOURED``)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import sys
from functools import cache
from pathlib import Path

from transformers import TrainingArguments

from gkv_train.config.options import check_range

# GRPOConfig fields that only TRL's own generation reads: with the rollout engine (no use_vllm) they do nothing
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
LOADED_HERE = (
    "the model is loaded by this project (model=..., gkv_train.models.load_model: its precision is precision=, its "
    "attention the project's own), not by TRL, and runs no code from the hub: leave it out"
)
# fields the trainer would accept and ignore here, or apply on a path this project replaces -> why, what to use
NOT_HONOURED = {
    "num_train_epochs": "a run's length is max_steps, which every run sets (and which overrides epochs): set max_steps",
    "model_init_kwargs": LOADED_HERE,
    "trust_remote_code": LOADED_HERE,
    "fsdp": (
        "the rollout engine decodes a different number of steps in each process and needs whole weights, which "
        "this project gathers under DeepSpeed ZeRO only: launch with accelerate launch --config_file "
        "recipes/accelerate/zero3.yaml train.py ..."
    ),
    "fsdp_config": "FSDP is not supported here (see fsdp): launch with DeepSpeed ZeRO (recipes/accelerate/zero3.yaml)",
}
# transformers' fields for training scripts, which its Trainer does not read -> what this project has instead
SCRIPT_INSTEAD = {
    "resume_from_checkpoint": "resume a run with resume=<checkpoint folder> or resume=last",
    "do_train": "train.py always trains (max_steps steps)",
    "do_eval": "evaluation during training is eval_steps=N; the final evaluation on eval_data always runs",
    "do_predict": "evaluate a trained run with scripts/evaluate.py (gkv-train evaluate)",
}
SEED_MOST = 2**32 - 1  # numpy's generator, which transformers' set_seed seeds, takes 0 .. 2**32 - 1
# GRPOConfig's fields of choices -> the values TRL's GRPOTrainer reads (checked only once it is built or has rolled out)
GRPO_CHOICES = {
    "importance_sampling_level": ("token", "sequence"),
    "multi_objective_aggregation": ("sum_then_normalize", "normalize_then_sum"),
}
VLLM_CHOICES = {
    "vllm_mode": ("colocate", "server"),
    "vllm_importance_sampling_mode": ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
}


def field_defaults(cls: type) -> dict:
    """``cls``'s dataclass fields at their defaults (a factory's value built)."""
    found = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            found[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            found[f.name] = f.default_factory()
    return found


@cache
def never_honoured() -> dict[str, str]:
    """The fields no run here honours, whatever their value (field -> why, and what to use): ``NOT_HONOURED`` and
    transformers' ``TrainingArguments`` fields that its help says its Trainer does not read (they are for training
    scripts: ``do_train``, ``resume_from_checkpoint``, ...). Not keys of a training configuration
    (``compose.check_overrides`` refuses them by name)."""
    found = dict(NOT_HONOURED)
    for f in dataclasses.fields(TrainingArguments):
        if "not directly used by" in " ".join(f.metadata.get("help", "").split()).lower():
            instead = SCRIPT_INSTEAD.get(f.name, "this project's train.py does not read it: leave it out")
            found[f.name] = f"transformers leaves it to training scripts (its Trainer does not read it); {instead}"
    return found


def not_honoured(config) -> dict[str, str]:
    """The fields of ``config`` that its run would not honour (field -> why, and what to use), given its other
    settings: ``never_honoured``, TRL's vLLM fields and the generation options the rollout engine lacks without
    ``use_vllm``, the Hub's fields without ``push_to_hub``."""
    found = dict(never_honoured())
    names = {f.name for f in dataclasses.fields(config)}
    if not getattr(config, "use_vllm", True):
        engine = "TRL's vLLM generation (use_vllm=true, recipe=rl_full only); the rollout engine generates here"
        for name in sorted(n for n in names if n.startswith("vllm_")):
            correction = "; its importance sampling is rl.rollout_is" if "importance_sampling" in name else ""
            found[name] = f"it applies to {engine}{correction}"
        for name in ENGINE_IGNORES:
            found[name] = (
                "an option of TRL's own generation, which the rollout engine does not have (it samples with "
                "temperature and top_p): drop it (use_vllm=true, recipe=rl_full only, generates through TRL's vLLM "
                "path, which reads it)"
            )
    if not config.push_to_hub:
        for name in sorted(n for n in names if n.startswith("hub_")):
            found[name] = "it applies to pushes to the Hugging Face Hub: add push_to_hub=true, or leave it out"
    return {name: why for name, why in found.items() if name in names}


def check_honoured(config) -> None:
    """The fields of ``config`` as given (before TRL's and transformers' ``__post_init__``): one this run would not
    honour (``not_honoured``) set away from its default, or a ``deepspeed`` file that is not a JSON object, is
    refused; ValueError naming the field, why, and what to use."""
    defaults, unset = field_defaults(type(config)), (None, "", [], {})
    for name, why in not_honoured(config).items():
        value, default = getattr(config, name), defaults.get(name)
        if value != default and not (value in unset and default in unset):
            raise ValueError(f"{name}={value!r} is not honoured here: {why}")
    if isinstance(config.deepspeed, str) and not config.deepspeed.lstrip().startswith("{"):
        path = Path(config.deepspeed).expanduser()
        if not path.is_file():
            raise ValueError(f"deepspeed={config.deepspeed}: no such file (a DeepSpeed configuration, JSON)")
        try:
            settings = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as err:
            raise ValueError(f"deepspeed={config.deepspeed}: the file is not JSON ({err})") from None
        if not isinstance(settings, dict):
            raise ValueError(f"deepspeed={config.deepspeed}: the file must hold a JSON object of DeepSpeed's settings")
    pad = getattr(config, "pad_to_multiple_of", None)
    if pad not in (None, "auto") and (isinstance(pad, bool) or not isinstance(pad, int) or pad < 1):
        raise ValueError(f"pad_to_multiple_of={pad!r}: expected an integer of at least 1, auto or null")


def check_as_trainer_would(config) -> None:
    """The checks TRL and transformers make of ``config`` only once the trainer is built or the first rollout has
    run, made when it is built (after their ``__post_init__``): seeds, the optimizer's numbers and package, the
    schedule's arguments, Liger's install, GRPO's choices, ranges and installs. ValueError naming the field."""
    from transformers.utils import is_liger_kernel_available

    for name in ("seed", "data_seed"):
        value = getattr(config, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MOST):
            raise ValueError(
                f"{name} must be an integer in [0, 2**32 - 1] (numpy's generator, which transformers seeds with it, "
                f"takes no other), got {value}"
            )
    check_range("adam_beta1", config.adam_beta1, low=0, high=1, high_open=True)
    check_range("adam_beta2", config.adam_beta2, low=0, high=1, high_open=True)
    check_range("adam_epsilon", config.adam_epsilon, low=0)
    check_range("weight_decay", config.weight_decay, low=0)
    check_optimizer(config)
    check_schedule(config)
    if config.use_liger_kernel and not is_liger_kernel_available():
        raise ValueError(
            "use_liger_kernel=true needs liger-kernel >= 0.3.0 (GPU kernels), which is not installed here: "
            "pip install liger-kernel, or drop use_liger_kernel"
        )
    if hasattr(config, "importance_sampling_level"):
        check_grpo(config)


def check_optimizer(config) -> None:
    """``optim``'s package is installed: transformers' own lookup of the optimizer class (which the trainer makes
    when training starts); ValueError naming the optimizer and the package."""
    from transformers import Trainer

    try:
        Trainer.get_optimizer_cls_and_kwargs(config)
    except (ImportError, ValueError) as err:  # a missing package; other needs (GaLore's model) are the trainer's
        if isinstance(err, ImportError) or "install" in str(err):
            raise ValueError(f"optim={config.optim.value} needs a package that is not installed here: {err}") from None


def check_schedule(config) -> None:
    """``lr_scheduler_kwargs`` a mapping of the schedule's own arguments (its function's parameters in transformers;
    the constant schedules are given none), and ``warmup_steps`` only with a schedule that warms up."""
    from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION
    from transformers.trainer_utils import SchedulerType

    kind = SchedulerType(config.lr_scheduler_type)
    parameters = inspect.signature(TYPE_TO_SCHEDULER_FUNCTION[kind]).parameters
    given = config.lr_scheduler_kwargs
    if given is not None and not isinstance(given, dict):
        raise ValueError(
            f"lr_scheduler_kwargs={given!r}: expected a mapping of the schedule's arguments "
            "(lr_scheduler_kwargs={num_cycles: 0.5})"
        )
    own = [p for p in parameters if p not in ("optimizer", "num_warmup_steps", "num_training_steps")]
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    constant = kind in (SchedulerType.CONSTANT, SchedulerType.CONSTANT_WITH_WARMUP)  # get_scheduler passes them none
    for key in given or {}:
        if constant or not (key in own or takes_any):
            arguments = "none (transformers passes it none)" if constant else ", ".join(own)
            raise ValueError(
                f"lr_scheduler_kwargs.{key} is not an argument of lr_scheduler_type={kind.value} (its arguments: "
                f"{arguments}): leave it out, or choose the schedule that takes it"
            )
    if config.warmup_steps and "num_warmup_steps" not in parameters:
        raise ValueError(
            f"warmup_steps={config.warmup_steps:g}: lr_scheduler_type={kind.value} has no warmup (transformers ignores "
            "it): use lr_scheduler_type=constant_with_warmup (or another schedule that warms up), or leave it out"
        )


def check_grpo(config) -> None:
    """GRPO's fields that TRL reads only once its trainer is built or has rolled out: choices, ranges, the
    reference model's synchronisation, ``use_vllm``'s install."""
    from trl.import_utils import is_vllm_available

    choices = {**GRPO_CHOICES, **(VLLM_CHOICES if config.use_vllm else {})}
    for name, allowed in choices.items():
        if getattr(config, name) not in allowed:
            raise ValueError(f"unknown {name} {getattr(config, name)!r}; choose one of {', '.join(allowed)}")
    if config.delta is not None:
        check_range("delta", config.delta, low=1, low_open=True, note=" (a cap on the probability ratio, 1 on-policy)")
    check_range("top_entropy_quantile", config.top_entropy_quantile, low=0, high=1)
    if config.sync_ref_model:
        if config.beta == 0:
            raise ValueError(
                "sync_ref_model=true synchronises the reference model, which beta=0 does not load: set beta > 0, or "
                "drop sync_ref_model"
            )
        if config.lora.enabled:
            raise ValueError(
                "sync_ref_model=true with lora.enabled=true: with LoRA the reference is the model without its "
                "adapters (TRL keeps no reference model to synchronise): drop one"
            )
        check_range("ref_model_mixup_alpha", config.ref_model_mixup_alpha, low=0, high=1)
        check_range("ref_model_sync_steps", config.ref_model_sync_steps, low=1)
    if config.use_vllm and not is_vllm_available():
        raise ValueError(
            "use_vllm=true generates through vLLM, which is not installed here: pip install 'trl[vllm]' (a GPU "
            "machine), or drop use_vllm (the rollout engine generates)"
        )


def precision_from_launcher(overrides: list[str]) -> list[str]:
    """The run's ``precision`` and ``accelerate launch``'s mixed precision (its config file or ``--mixed_precision``,
    which accelerate passes on as ``ACCELERATE_MIXED_PRECISION``; the DeepSpeed recipes say bf16) agree by
    construction: a launch in bf16 whose overrides name no precision trains in bf16 (``precision=bf16`` added,
    said in one line); overrides that contradict the launcher are refused before any work, naming both."""
    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION", "no") or "no"
    if launcher == "no":
        return overrides
    if launcher != "bf16":
        raise ValueError(
            f"accelerate launches with mixed_precision={launcher}; training here is fp32 or bf16: launch "
            "with --mixed_precision bf16 (or no) and set precision=bf16 (or fp32)"
        )
    given = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] == "precision"]
    if not given:
        print("precision=bf16: accelerate launches with mixed_precision=bf16", file=sys.stderr, flush=True)
        return [*overrides, "precision=bf16"]
    if given[-1].partition("=")[2] == "bf16":
        return overrides
    raise ValueError(
        f"{given[-1]}, but accelerate launches with mixed_precision=bf16 (its config file or --mixed_precision): give "
        "precision=bf16, or launch with --mixed_precision no"
    )
