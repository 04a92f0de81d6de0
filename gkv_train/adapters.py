"""LoRA adapter folders (``adapter=`` of evaluate, lm-eval's model ``gkv``, a LoRA run given to ``gkv-train
export``): what a folder holds, read and checked before any model loads (``read_adapter``), and whether it fits a
model's modules (``fit_problem``: each module it has weights for exists, with the features its weights need, at the
rank its configuration gives; each module it targets exists). ``gkv_train.models.check_adapter`` adds the base's
identity and ``load_model(..., adapter=...)`` applies it. Leaf module: no import of ``gkv_train.models``."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

PREFIX = "base_model.model."  # PEFT's prefix of a saved LoRA weight's name
WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


@dataclass
class Adapter:
    """An adapter folder as read by ``read_adapter``: its ``path`` (as given), ``config`` (adapter_config.json) and
    ``shapes`` (each saved weight's name, PEFT's prefix removed -> its shape)."""

    path: str
    config: dict
    shapes: dict[str, tuple[int, ...]]

    @property
    def base(self) -> str | None:
        """The model it was trained on, as its configuration names it (``base_model_name_or_path``)."""
        base = self.config.get("base_model_name_or_path")
        return base if isinstance(base, str) and base else None


def read_adapter(path: str) -> Adapter:
    """A LoRA adapter folder that loads: a folder with a PEFT ``adapter_config.json`` (a JSON object naming its
    ``peft_type``) and whole adapter weights (``gkv_train.manifest.damage``: against its manifest, else by
    content). ValueError / FileNotFoundError naming the folder and what is wrong (a full model's folder is named as
    such: it is given as ``model=``)."""
    from gkv_train.manifest import damage

    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"adapter={path}: no such folder (a LoRA adapter folder, e.g. a train.py run's)")
    config = folder / "adapter_config.json"
    if not config.is_file():
        full = (folder / "config.json").is_file()
        raise ValueError(
            f"adapter={path} holds no adapter_config.json: "
            + ("a full model's folder, given as model=<it> (without adapter=)" if full else "not a LoRA adapter folder")
        )
    try:
        settings = json.loads(config.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"adapter={path}: {config} is not JSON ({err})") from None
    if not isinstance(settings, dict) or not isinstance(settings.get("peft_type"), str):
        raise ValueError(f"adapter={path}: {config} is not a PEFT adapter's configuration (no peft_type)")
    weights = [folder / n for n in WEIGHTS if (folder / n).is_file()]
    if not weights:
        raise ValueError(f"adapter={path} holds no adapter weights (adapter_model.safetensors or .bin)")
    problem = damage(folder)
    if problem is not None:
        raise ValueError(f"adapter={path} is damaged ({problem})")
    return Adapter(path, settings, weight_shapes(weights[0]))


def weight_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Each weight's name (PEFT's prefix removed) -> shape, from a safetensors header or a torch file's tensors."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(path, "pt") as f:
            found = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    else:
        import torch

        found = {key: tuple(t.shape) for key, t in torch.load(path, map_location="cpu", weights_only=True).items()}
    return {key.removeprefix(PREFIX): shape for key, shape in found.items()}


def rank(config: dict, module: str) -> int | None:
    """The LoRA rank PEFT gives ``module``: its ``rank_pattern`` entry (PEFT's matching: the pattern ends the
    module's name at a dot), else ``r``."""
    for pattern, r in (config.get("rank_pattern") or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            return r
    return config.get("r")


def targets(config: dict, names: list[str]) -> list[str]:
    """The entries of ``target_modules`` that match none of the module ``names`` (PEFT's matching: a listed name
    ends a module's name at a dot; a string is a regular expression over whole names; ``all-linear``: any)."""
    wanted = config.get("target_modules")
    if wanted is None or wanted == "all-linear":
        return []
    if isinstance(wanted, str):
        return [] if any(re.fullmatch(wanted, n) for n in names) else [wanted]
    return [t for t in wanted if not any(n == t or n.endswith("." + t) for n in names)]


def fit_problem(adapter: Adapter, modules: dict, model: str) -> str | None:
    """What keeps ``adapter`` from fitting ``model`` (its ``modules``: name -> module, as ``named_modules()`` gives;
    weights need not be loaded), or None. A LoRA weight ``<module>.lora_A.weight`` [r, in] / ``lora_B.weight``
    [out, r] needs ``<module>`` to be a linear layer of those features, r the rank of its configuration."""
    if adapter.config.get("peft_type") != "LORA":
        return None
    missing = targets(adapter.config, list(modules))
    if missing:
        return f"it targets {missing[0]!r} (target_modules in its adapter_config.json), which no module of {model} is"
    for key, shape in adapter.shapes.items():
        parts = key.split(".")
        at = next((i for i, p in enumerate(parts) if p.startswith("lora_")), None)
        if at is None:
            continue
        name, which = ".".join(parts[:at]), parts[at]
        module = modules.get(name)
        if module is None:
            return f"it holds weights for {name}, which {model} has not"
        features = (getattr(module, "in_features", None), getattr(module, "out_features", None))
        if which not in ("lora_A", "lora_B") or None in features or len(shape) != 2:
            continue
        r = rank(adapter.config, name)
        want = (r, features[0]) if which == "lora_A" else (features[1], r)
        saved_rank, features_of = (shape[0], shape[1]) if which == "lora_A" else (shape[1], shape[0])
        if shape != want and features_of == want[1 if which == "lora_A" else 0]:
            return f"its {key} has rank {saved_rank}, and its adapter_config.json gives {name} r={r}"
        if shape != want:
            return (
                f"its {key} is {list(shape)}, and {model}'s {name} ({features[0]} -> {features[1]} features) at rank "
                f"r={r} takes {list(want)}"
            )
    return None
