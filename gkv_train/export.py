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

from gkv_train.adapters import read_adapter
from gkv_train.models import check_adapter, check_model, load_model
from gkv_train.runs.manifest import damage


def export(run_dir: str | Path, out_dir: str | Path) -> Path:
    """Merge (LoRA) or copy (full) the model of ``run_dir`` into ``out_dir``; returns ``out_dir``."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    adapter = run_dir / "adapter_config.json"
    if not run_dir.is_dir() or not (adapter.is_file() or (run_dir / "config.json").is_file()):
        raise ValueError(f"{run_dir} holds no trained model (no adapter_config.json or config.json)")
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"{out_dir} is a file, not a folder: name a new or empty folder")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ValueError(f"{out_dir} exists and is not empty")
    problem = damage(run_dir)
    if problem is not None:
        raise ValueError(f"{run_dir}: the trained model is damaged ({problem})")
    if adapter.is_file():
        base_name = read_adapter(str(run_dir)).base
        if base_name is None:
            raise ValueError(f"{adapter} names no base model (base_model_name_or_path)")
        check_model(base_name)
        check_adapter(str(run_dir), base_name)
        model, tokenizer = load_model(base_name, adapter=str(run_dir))
    else:
        model, tokenizer = load_model(str(run_dir))
    model.config._attn_implementation = "sdpa"
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "README.md").write_text(model_card(run_dir, out_dir, adapter.is_file()))
    return out_dir


def model_card(run_dir: Path, out_dir: Path, merged: bool) -> str:
    """The merged folder's card: where it comes from (the run, its base model, the compression it was trained
    under when the run's resolved configuration says) and how to load it."""
    base = json.loads((run_dir / "adapter_config.json").read_text())["base_model_name_or_path"] if merged else None
    trained = ""
    config = run_dir / "hydra" / "config.yaml"
    if config.is_file():
        import yaml

        values = yaml.safe_load(config.read_text()) or {}
        compression = values.get("compression") or {}
        trained = (
            f"Trained with recipe `{values.get('recipe')}` under the KV-cache compression "
            f"`{compression.get('method')}` (budget {compression.get('budget')}): it is meant to run with that "
            "compression (gkv-train's rollout engine or lm-eval model, `method=...`).\n\n"
        )
    source = f"LoRA adapter of `{run_dir}` merged into its base `{base}`" if merged else f"`{run_dir}`"
    return (
        f"# {out_dir.name}\n\nExported by `gkv-train export` from {source}.\n\n{trained}"
        "## Quick start\n\n```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        f'model = AutoModelForCausalLM.from_pretrained("{out_dir}")\n'
        f'tokenizer = AutoTokenizer.from_pretrained("{out_dir}")\n```\n'
    )
