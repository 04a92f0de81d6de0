"""``gkv-train export RUN_DIR OUT_DIR``: a trained run as a self-contained Hugging Face folder.

A LoRA run (``adapter_config.json`` in ``RUN_DIR``) is merged into its base (the base named in the adapter's
configuration: the run's ``model``); a full fine-tune is loaded as it is. The folder holds the weights
(safetensors), the configuration with the standard attention (``sdpa``: this project's registered attention
function is not needed to load or run it) and the tokenizer, so ``AutoModelForCausalLM.from_pretrained(OUT_DIR)``
loads it anywhere, without this package. The run's files are checked against its manifest first (a damaged one is
named, before anything is loaded)."""

from __future__ import annotations

import json
from pathlib import Path

from gkv_train.checkpoints import damage
from gkv_train.models import load_model


def export(run_dir: str | Path, out_dir: str | Path) -> Path:
    """Merge (LoRA) or copy (full) the model of ``run_dir`` into ``out_dir``; returns ``out_dir``."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    adapter = run_dir / "adapter_config.json"
    if not run_dir.is_dir() or not (adapter.is_file() or (run_dir / "config.json").is_file()):
        raise ValueError(f"{run_dir} holds no trained model (no adapter_config.json or config.json)")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ValueError(f"{out_dir} exists and is not empty")
    problem = damage(run_dir)
    if problem is not None:
        raise ValueError(f"{run_dir}: the trained model is damaged ({problem})")
    if adapter.is_file():
        from peft import PeftModel

        base, tokenizer = load_model(json.loads(adapter.read_text())["base_model_name_or_path"])
        model = PeftModel.from_pretrained(base, str(run_dir)).merge_and_unload()
    else:
        model, tokenizer = load_model(str(run_dir))
    model.config._attn_implementation = "sdpa"
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
