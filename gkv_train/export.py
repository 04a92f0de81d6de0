"""``gkv-train export RUN_DIR OUT_DIR``: a trained run as a self-contained Hugging Face folder.

A LoRA run (``adapter_config.json`` in ``RUN_DIR``) is merged into its base (the base named in the adapter's
configuration: the run's ``model``); a full fine-tune is loaded as it is. The folder holds the weights
(safetensors), the configuration with the standard attention (``sdpa``: this project's registered attention
function is not needed to load or run it) and the tokenizer, so ``AutoModelForCausalLM.from_pretrained(OUT_DIR)``
loads it anywhere, without this package. The run's files are checked against its manifest first (a damaged one is
named, before anything is loaded), and everything else before anything is written (``export``). ``OUT_DIR`` is a new
or empty folder (``--overwrite``: one holding other files, whose model files are replaced), never the run's or its
base model's; it is locked while the export writes it, and written whole or not at all (``write_export``).

    gkv-train export RUN_DIR OUT_DIR [--overwrite]"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gkv_train.jsonio import read_state
from gkv_train.manifest import damage
from gkv_train.models import check_adapter, check_model, load_model
from gkv_train.runs.checkpoints import MODEL_FILES
from gkv_train.runs.outputs import EXPORT_STAGING, check_output
from gkv_train.runs.runlock import RunLock
from gkv_train.storage import naming_full_disk


def export(run_dir: str | Path, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Merge (LoRA) or copy (full) the model of ``run_dir`` into ``out_dir``; returns ``out_dir``. Everything is
    checked before anything is written: ``out_dir`` by the rule of every job's output (``check_output``: a new or
    empty folder, or ``overwrite``; never the run's folder, nor one holding it or in it, nor another training run's
    folder, nor a LoRA run's base model's), the run's model (whole against its manifest; a LoRA adapter's base) and
    its saved configuration (``model_card``). The folder is then locked (``RunLock``: a second export or a training
    run into it is refused meanwhile), checked again, and written (``write_export``)."""
    if not str(run_dir).strip():
        raise ValueError("RUN_DIR is empty: name the training run's folder to export")
    run_dir = Path(run_dir)
    adapter = run_dir / "adapter_config.json"
    if not run_dir.is_dir() or not (adapter.is_file() or (run_dir / "config.json").is_file()):
        raise ValueError(f"{run_dir} holds no trained model (no adapter_config.json or config.json)")
    base_name = adapter_base(adapter) if adapter.is_file() else None
    inputs = {"RUN_DIR": str(run_dir), f"{adapter}'s base_model_name_or_path": base_name}
    check_output("export", str(out_dir), "OUT_DIR", overwrite=overwrite, inputs=inputs, flag="--overwrite")
    out_dir = Path(out_dir)
    problem = damage(run_dir)
    if problem is not None:
        raise ValueError(f"{run_dir}: the trained model is damaged ({problem})")
    if base_name is not None:
        check_model(base_name)
        check_adapter(str(run_dir), base_name)
    card = model_card(run_dir, out_dir, base_name)
    if base_name is not None:
        model, tokenizer = load_model(base_name, adapter=str(run_dir))
    else:
        model, tokenizer = load_model(str(run_dir))
    model.config._attn_implementation = "sdpa"
    out_dir.mkdir(parents=True, exist_ok=True)
    with RunLock.acquire(out_dir, "OUT_DIR"):
        check_output(
            "export", str(out_dir), "OUT_DIR", overwrite=overwrite, inputs=inputs, flag="--overwrite", held=True
        )
        write_export(model, tokenizer, card, out_dir)
    return out_dir


def adapter_base(adapter: Path) -> str:
    """The base model a LoRA run's ``adapter_config.json`` names (``base_model_name_or_path``), read before anything
    else (``read_state``): the export reads it, so it is never the export's folder. ValueError naming the file when
    it is damaged or names none."""
    base = read_state(adapter).get("base_model_name_or_path")
    if not isinstance(base, str) or not base.strip():
        raise ValueError(f"{adapter} names no base model (base_model_name_or_path)")
    return base


def write_export(model, tokenizer, card: str, out_dir: Path) -> None:
    """The model, tokenizer and ``card`` (README.md) into ``out_dir`` (locked by the caller), whole or not at all:
    saved into its staging folder (``EXPORT_STAGING``; one an interrupted export left is removed first) and moved in
    file by file once complete; an earlier export's model files that none of the new ones replaces (a larger model's
    shards) removed last. A save that fails (a full disk: named) removes the staging folder and leaves ``out_dir``
    as it was."""
    staging = out_dir / EXPORT_STAGING
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with naming_full_disk(staging, "the exported model"):
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            (staging / "README.md").write_text(card)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    saved = sorted(staging.iterdir())
    names = {path.name for path in saved}
    earlier = {p for pattern in (*MODEL_FILES, "README.md") for p in out_dir.glob(pattern) if p.is_file()}
    for path in saved:
        os.replace(path, out_dir / path.name)
    for path in sorted(earlier):
        if path.name not in names:
            path.unlink()
    staging.rmdir()


def model_card(run_dir: Path, out_dir: Path, base: str | None) -> str:
    """The merged folder's card: where it comes from (the run, the base model of a merged adapter, the compression it
    was trained under when the run's resolved configuration, ``hydra/config.yaml``, says) and how to load it.
    ValueError naming the configuration when it is damaged (``read_state``; its compression not a mapping)."""
    trained = ""
    config = run_dir / "hydra" / "config.yaml"
    if config.is_file():
        values = read_state(config)
        compression = values.get("compression") or {}
        if not isinstance(compression, dict):
            raise ValueError(f"{config} is damaged (its compression is a {type(compression).__name__}, not a mapping)")
        trained = (
            f"Trained with recipe `{values.get('recipe')}` under the KV-cache compression "
            f"`{compression.get('method')}` (budget {compression.get('budget')}): it is meant to run with that "
            "compression (gkv-train's rollout engine or lm-eval model, `method=...`).\n\n"
        )
    source = f"LoRA adapter of `{run_dir}` merged into its base `{base}`" if base else f"`{run_dir}`"
    return (
        f"# {out_dir.name}\n\nExported by `gkv-train export` from {source}.\n\n{trained}"
        "## Quick start\n\n```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        f'model = AutoModelForCausalLM.from_pretrained("{out_dir}")\n'
        f'tokenizer = AutoTokenizer.from_pretrained("{out_dir}")\n```\n'
    )
