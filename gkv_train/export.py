"""``gkv-train export RUN_DIR OUT_DIR``: a trained run as a self-contained Hugging Face folder.

A LoRA run (``adapter_config.json`` in ``RUN_DIR``) is merged into its base (the base named in the adapter's
configuration: the run's ``model``); a full fine-tune is loaded as it is. The folder holds the weights
(safetensors), the configuration with the standard attention (``sdpa``: this project's registered attention
function is not needed to load or run it) and the tokenizer, so ``AutoModelForCausalLM.from_pretrained(OUT_DIR)``
loads it anywhere, without this package. The run's files are checked against its manifest first (a damaged one is
named, before anything is loaded), and everything else before anything is written (``export``). ``OUT_DIR`` is a new
or empty folder (``--overwrite``: one holding other files, whose model files are replaced).

    gkv-train export RUN_DIR OUT_DIR [--overwrite]"""

from __future__ import annotations

from pathlib import Path

from gkv_train.jsonio import read_state
from gkv_train.models import check_adapter, check_model, load_model
from gkv_train.runs.checkpoints import MODEL_FILES
from gkv_train.runs.manifest import damage
from gkv_train.runs.outputs import check_output


def export(run_dir: str | Path, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Merge (LoRA) or copy (full) the model of ``run_dir`` into ``out_dir``; returns ``out_dir``. Everything is
    checked before anything is written: the run's model (whole against its manifest; a LoRA adapter's base), its
    saved configuration (``model_card``), and ``out_dir`` by the rule of every job's output (``check_output``: a new
    or empty folder, or ``overwrite``, whose model files are removed first; never the run's folder, inside it or
    holding it, nor another training run's folder)."""
    if not str(run_dir).strip():
        raise ValueError("RUN_DIR is empty: name the training run's folder to export")
    run_dir = Path(run_dir)
    adapter = run_dir / "adapter_config.json"
    if not run_dir.is_dir() or not (adapter.is_file() or (run_dir / "config.json").is_file()):
        raise ValueError(f"{run_dir} holds no trained model (no adapter_config.json or config.json)")
    check_output(
        "export", str(out_dir), "OUT_DIR", overwrite=overwrite, inputs={"RUN_DIR": str(run_dir)}, flag="--overwrite"
    )
    out_dir = Path(out_dir)
    problem = damage(run_dir)
    if problem is not None:
        raise ValueError(f"{run_dir}: the trained model is damaged ({problem})")
    base_name = None
    if adapter.is_file():
        check_adapter(str(run_dir))
        base_name = read_state(adapter).get("base_model_name_or_path")
        if not isinstance(base_name, str):
            raise ValueError(f"{adapter} names no base model (base_model_name_or_path)")
        check_model(base_name)
    card = model_card(run_dir, out_dir, base_name)
    if base_name is not None:
        from peft import PeftModel

        base, tokenizer = load_model(base_name)
        model = PeftModel.from_pretrained(base, str(run_dir)).merge_and_unload()
    else:
        model, tokenizer = load_model(str(run_dir))
    model.config._attn_implementation = "sdpa"
    if overwrite:  # an earlier export's files go first (a larger model's shards would stay beside the new ones)
        for path in [p for pattern in (*MODEL_FILES, "README.md") for p in out_dir.glob(pattern) if p.is_file()]:
            path.unlink()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "README.md").write_text(card)
    return out_dir


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
