"""The manifest of a saved model or checkpoint folder (``manifest.json``: every file's size and SHA-256, and the
settings its optimizer and scheduler state were made with), and what is wrong with a folder against it: a file
damaged after it was saved (truncated, overwritten) is found before it is loaded.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from transformers.trainer import TRAINER_STATE_NAME

from gkv_train.jsonio import dumps, write_atomically

MANIFEST = "manifest.json"
CHECKPOINT = re.compile(r"checkpoint-(\d+)")  # a checkpoint folder's name and its step


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
    """The manifest of ``folder`` (None: it has none: a checkpoint of an earlier version); ValueError naming the
    file when it is damaged."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
            raise ValueError("not a manifest")
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is damaged ({err})") from None
    return manifest


def damage(folder: Path, hashes: bool = True) -> str | None:
    """What is wrong with the saved files of ``folder`` against its manifest (a missing file, another size, another
    SHA-256 when ``hashes``), or None when they are whole; a folder without a manifest (an earlier version's) is
    checked for a readable trainer state when it is a checkpoint."""
    folder = Path(folder)
    try:
        manifest = read_manifest(folder)
    except ValueError as err:
        return str(err)
    if manifest is None:
        if CHECKPOINT.fullmatch(folder.name):
            try:
                json.loads((folder / TRAINER_STATE_NAME).read_text())["global_step"]
            except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
                return f"{folder / TRAINER_STATE_NAME} is damaged ({type(err).__name__}: {err})"
        return None
    for name, saved in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        size = path.stat().st_size
        if size != saved["bytes"]:
            return f"{path} has {size} bytes, {saved['bytes']} when it was saved"
        if hashes and sha256(path) != saved["sha256"]:
            return f"{path} differs from what was saved (SHA-256)"
    return None


def saved_settings(folder: Path) -> dict | None:
    """The settings a checkpoint's optimizer and scheduler state were made with (None: no manifest)."""
    manifest = read_manifest(folder)
    return None if manifest is None else manifest.get("settings")
