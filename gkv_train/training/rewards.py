"""The reward functions a training recipe names (``rewards``: ``package.module.name`` paths): imported, and checked
to take the arguments TRL calls a reward with, before any model loads."""

from __future__ import annotations

import importlib


def import_callable(path: str):
    """``package.module.name`` -> the object (reward functions are named this way in recipes, the project's own
    ``gkv_rewards.functions...``). Importing runs the module's code: a configuration names code to run."""
    module, _, name = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"cannot import reward function {path!r}: {err}") from err
    if not callable(found):
        raise ValueError(f"reward function {path!r} is a {type(found).__name__}, not a callable")
    return found


def check_reward(path: str, reward, columns: list[str]) -> None:
    """The reward function ``reward`` (named ``path``) takes the arguments TRL calls it with: ``prompts``,
    ``completions``, ``completion_ids``, the training data's ``columns``, ``trainer_state``, ``log_extra``,
    ``log_metric`` (by keyword; ``**kwargs`` takes those it does not read). ValueError otherwise, before the model
    loads (TRL would call it only after the first rollout)."""
    import inspect

    names = ["prompts", "completions", "completion_ids", *columns, "trainer_state", "log_extra", "log_metric"]
    try:
        inspect.signature(reward).bind(**dict.fromkeys(names))
    except (TypeError, ValueError) as err:  # ValueError: no signature to read
        raise ValueError(
            f"reward function {path!r} cannot take TRL's reward arguments ({err}): a reward is a callable "
            "f(prompts, completions, **kwargs) -> list[float] (gkv_rewards.functions.accuracy)"
        ) from None
