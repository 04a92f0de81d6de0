"""The manifest of a saved model or checkpoint folder (``manifest.json``: every file's size and SHA-256, and the
settings its optimizer and scheduler state were made with), and what is wrong with a folder against it: a file
damaged after it was saved (truncated, overwritten) is found before it is loaded. Checkpoints, a run's final model, an
export, an adapter and the model cache's copies all carry one.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import sys
from pathlib import Path

from transformers.trainer import TRAINER_STATE_NAME

from gkv_train.jsonio import dumps, read_state, write_atomically

MANIFEST = "manifest.json"
CHECKPOINT = re.compile(r"checkpoint-(\d+)")  # a checkpoint folder's name and its step
# what transformers' Trainer reads from a checkpoint it resumes, besides the weights (``is_weights``), by the name of
# an entry of the checkpoint's folder: its state, the optimizer's, scheduler's, grad scaler's and RNG states, the
# model's and adapter's configurations, a sharded model's index, DeepSpeed's and FSDP's state folders
LOADED = (
    TRAINER_STATE_NAME,
    "*.index.json",
    "optimizer*",
    "scheduler*",
    "scaler*",
    "rng_state*",
    "config.json",
    "adapter_config.json",
    "global_step*",
    "latest",
    "pytorch_model_fsdp*",
)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path, files: list[Path], settings: dict) -> None:
    """``folder/manifest.json``: the size and SHA-256 of each of ``files`` (paths under ``folder``) and ``settings``
    (what the saved state was made with: ``resume_settings``)."""
    folder = Path(folder)
    entries = {str(f.relative_to(folder)): {"bytes": f.stat().st_size, "sha256": sha256(f)} for f in sorted(files)}
    write_atomically(folder / MANIFEST, dumps({"files": entries, "settings": settings}, indent=2))


def read_manifest(folder: Path) -> dict | None:
    """The manifest of ``folder`` (None: it has none: a checkpoint of an earlier version, or copied without it);
    ValueError naming the file when it is damaged: not a JSON object (``read_state``), an entry without its size and
    SHA-256, no weights listed, or (a checkpoint's) no trainer state listed."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    manifest = read_state(path)
    files = manifest.get("files")
    if not isinstance(files, dict):
        problem = "not a manifest: no files"
    else:
        problem = next(
            (
                f"its entry {name!r} is not a file of the folder with its bytes and sha256"
                for name, entry in files.items()
                if not (
                    isinstance(entry, dict)
                    and isinstance(entry.get("bytes"), int)
                    and isinstance(entry.get("sha256"), str)
                    and (folder / name).resolve().is_relative_to(Path(folder).resolve())
                )
            ),
            None,
        )
        if problem is None and not any(is_weights(name) for name in files):
            problem = "it lists no weights"
        if problem is None and CHECKPOINT.fullmatch(Path(folder).name) and TRAINER_STATE_NAME not in files:
            problem = f"it does not list {TRAINER_STATE_NAME}"
    if problem is not None:
        raise ValueError(f"{path} is damaged ({problem})")
    return manifest


def is_weights(name: str) -> bool:
    """Whether a saved folder's file ``name`` holds model weights: safetensors, or torch's (``pytorch_model*.bin``,
    ``adapter_model.bin``; not ``training_args.bin``)."""
    name = Path(name).name
    return name.endswith(".safetensors") or (
        name.startswith(("pytorch_model", "adapter_model")) and name.endswith(".bin")
    )


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with a ``.safetensors`` file as its header describes it (no header, a header that is not
    JSON, tensors past the end of the file or a size other than the tensors'), or None: a truncated or
    overwritten file found without a manifest (a flipped byte inside the tensors is not: only a manifest's
    SHA-256 finds that)."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if size < 8 or length > size - 8:
                return f"{path} has {size} bytes, shorter than its header says"
            header = json.loads(f.read(length))
        ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, IndexError, AttributeError) as err:
        return f"{path} is not a safetensors file ({type(err).__name__}: {err})"
    if 8 + length + max(ends, default=0) != size:
        return f"{path} has {size} bytes, {8 + length + max(ends, default=0)} as its header describes it"
    return None


def zip_problem(path: Path) -> str | None:
    """What is wrong with a file torch saved (a zip archive: each member's CRC is checked), or None."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
        return f"{path} is damaged ({type(err).__name__}: {err})"
    return f"{path} is damaged (member {bad} fails its CRC)" if bad is not None else None


def content_damage(folder: Path) -> str | None:
    """What is wrong with a folder that has no manifest, from its contents: a checkpoint's trainer state must read,
    every ``.safetensors`` file match its header, every file torch saved (``.pt``, ``.bin``) pass its archive's
    checks; and a model must have weights."""
    folder = Path(folder)
    if CHECKPOINT.fullmatch(folder.name):
        try:
            state = read_state(folder / TRAINER_STATE_NAME)
        except (OSError, ValueError) as err:
            return str(err)
        if not isinstance(state.get("global_step"), int):
            return f"{folder / TRAINER_STATE_NAME} is damaged (no global_step)"
    weights = [f for f in folder.iterdir() if f.is_file() and is_weights(f.name)]
    if not weights:
        return f"{folder} holds no weights (*.safetensors, *.bin)"
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.suffix == ".safetensors":
            problem = safetensors_problem(path)
        elif path.is_file() and path.suffix in (".pt", ".bin"):
            problem = zip_problem(path)
        else:
            continue
        if problem is not None:
            return problem
    return None


def damage(folder: Path, hashes: bool = True) -> str | None:
    """What is wrong with the saved files of ``folder`` against its manifest (a missing file, another size, another
    SHA-256 when ``hashes``), or None when they are whole; a folder without a manifest is checked by its contents
    (``content_damage``)."""
    folder = Path(folder)
    try:
        manifest = read_manifest(folder)
    except ValueError as err:
        return str(err)
    if manifest is None:
        return content_damage(folder)
    for name, saved in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        size = path.stat().st_size
        if size != saved["bytes"]:
            return f"{path} has {size} bytes, {saved['bytes']} when it was saved"
        if hashes and sha256(path) != saved["sha256"]:
            return f"{path} differs from what was saved (SHA-256)"
    if CHECKPOINT.fullmatch(folder.name):  # written whole and listed whole: a file it does not list was not saved
        return unlisted_damage(folder, manifest)
    return None


def unlisted_damage(checkpoint: Path, manifest: dict) -> str | None:
    """What is wrong with a checkpoint's files that its ``manifest`` does not list (added, or the manifest replaced,
    after the save): one that a resume loads (``LOADED``, weights) is damage; any other (a note, ``.DS_Store``, an
    NFS leftover) is not read, and is named in a warning on stderr."""
    names = sorted(str(f.relative_to(checkpoint)) for f in checkpoint.rglob("*") if f.is_file())
    unlisted = [name for name in names if name not in manifest["files"] and name != MANIFEST]
    loaded = [name for name in unlisted if is_loaded(name)]
    if loaded:
        return (
            f"{checkpoint / loaded[0]} is not listed in its manifest (not what was saved: added, or the manifest "
            "replaced, after the save)"
        )
    if unlisted:
        print(
            f"warning: {checkpoint} holds files its manifest does not list ({', '.join(unlisted[:5])}): not what "
            "was saved, and not read by a resume",
            file=sys.stderr,
        )
    return None


def is_loaded(name: str) -> bool:
    """Whether a resume reads a checkpoint's file ``name`` (relative to the checkpoint): transformers' Trainer loads
    the weights, and by the name of the checkpoint's entry it lies in, ``LOADED``."""
    top = Path(name).parts[0]
    return is_weights(name) or any(fnmatch.fnmatch(top, pattern) for pattern in LOADED)


def missing_training_state(checkpoint: Path) -> list[str]:
    """What a checkpoint lacks of the optimizer and scheduler state a resumed run continues (transformers' Trainer
    starts both afresh, saying nothing, when they are not there: a checkpoint saved with ``save_only_model=true``):
    ``optimizer.pt`` unless it holds an optimizer state (``optimizer.pt`` / ``.bin``, an ``optimizer*`` folder, or
    DeepSpeed's ``global_step*`` folder), ``scheduler.pt`` (outside DeepSpeed's, whose engine holds it)."""
    checkpoint = Path(checkpoint)
    folders = [p.name for p in checkpoint.iterdir() if p.is_dir()]
    deepspeed = any(name.startswith("global_step") for name in folders)
    optimizer = (
        deepspeed
        or any((checkpoint / name).is_file() for name in ("optimizer.pt", "optimizer.bin"))
        or any("optimizer" in name for name in folders)
    )
    missing = [] if optimizer else ["optimizer.pt"]
    return missing + ([] if deepspeed or (checkpoint / "scheduler.pt").is_file() else ["scheduler.pt"])


def saved_settings(folder: Path) -> dict | None:
    """The settings a checkpoint's optimizer and scheduler state were made with: its manifest's; without a manifest
    those its optimizer state holds (``optimizer_settings``); None when neither says."""
    manifest = read_manifest(folder)
    return optimizer_settings(Path(folder) / "optimizer.pt") if manifest is None else manifest.get("settings")


def optimizer_settings(path: Path) -> dict | None:
    """The settings a saved optimizer state (``optimizer.pt``, read as plain tensors and numbers, never as
    arbitrary objects) holds in its parameter groups, under ``TrainingArguments``' names: ``learning_rate`` (the
    scheduler's starting rate, ``initial_lr``), ``weight_decay`` (the largest of the groups': the decayed one),
    ``adam_beta1``, ``adam_beta2``, ``adam_epsilon``; None when there is no such file or it holds no groups."""
    import torch

    if not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=True)
    groups = state.get("param_groups") if isinstance(state, dict) else None
    if not groups:
        return None
    first = groups[0]
    found = {
        "learning_rate": first.get("initial_lr", first.get("lr")),
        "weight_decay": max(g.get("weight_decay", 0.0) for g in groups),
    }
    if "betas" in first:
        found["adam_beta1"], found["adam_beta2"] = (float(b) for b in first["betas"])
    if "eps" in first:
        found["adam_epsilon"] = first["eps"]
    return {k: v for k, v in found.items() if v is not None}
