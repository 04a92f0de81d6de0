"""The model cache: the copies ``gkv_train.models.load_model`` keeps of models that are no folder of their own (a
GGUF file dequantised to float32 safetensors, the tiny random models), so that a later load takes a second and the
model's ``name_or_path`` is a folder ``from_pretrained`` reloads (TRL builds its reference model that way).

A copy is written into a temporary folder beside its place, its manifest (``manifest.json``,
``gkv_train.manifest``: every file's size and SHA-256) last, then renamed into place. It is used only when it
matches its manifest, checked once per process while its files keep their sizes and modification times (SHA-256
of SmolLM2's 538 MB: about 1.1 s). A copy that does not match (a byte changed, a file missing or added, no
manifest: damaged, or made before copies carried one) is removed with a warning naming it and made again from its
source; where it cannot be removed (a read-only cache) the load is refused, naming it, before anything is
converted. A full disk or a file-size limit while writing a copy is an error naming the copy and the limit, and
leaves no part of it behind. Leaf module: no import of ``gkv_train.models``.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import shutil
from pathlib import Path

from safetensors import SafetensorError

from gkv_train.manifest import MANIFEST, damage, read_manifest, write_manifest
from gkv_train.storage import existing_ancestor, naming_full_disk

log = logging.getLogger(__name__)

REQUIRED = ("config.json", "model.safetensors", "tokenizer.json")  # what every copy holds
_SOUND: set[tuple] = set()  # the copies (with their files' stat) that matched their manifest in this process


def cache_root() -> Path:
    """Where copies are kept: ``$GKV_TRAIN_CACHE`` made absolute; unset or empty, ``~/.cache/gkv_train`` (as an empty
    ``XDG_CACHE_HOME`` reads: never the current folder)."""
    given = os.environ.get("GKV_TRAIN_CACHE", "")
    if not given.strip():
        return Path.home() / ".cache" / "gkv_train"
    return Path(os.path.abspath(os.path.expanduser(given)))


def gguf_copy(gguf: Path) -> Path:
    """Where the float32 copy of a GGUF model is kept, keyed by the SHA-256 of the whole file: every install of the
    same file, one per virtual environment or clone, shares one copy, and two files that differ anywhere do not."""
    stat = gguf.stat()
    return cache_root() / f"{gguf.stem}-{file_digest(str(gguf.resolve()), stat.st_size, stat.st_mtime_ns)}"


@functools.lru_cache(maxsize=16)
def gguf_fields(gguf: Path) -> dict:
    """The metadata fields of the GGUF file ``gguf``, parsed whole (its tensors' places too, before transformers reads
    it): ValueError naming the file as damaged when it cannot be (cut short: numpy's "cannot reshape" of a tensor
    past its end)."""
    from gguf import GGUFReader

    try:
        return GGUFReader(str(gguf)).fields
    except Exception as err:  # the parser's own errors: any of them means the file is no whole GGUF file
        raise ValueError(
            f"model file {gguf} is damaged (cut short, or not a GGUF file: {err}): download or copy it again"
        ) from None


def file_digest(path: str, size: int, mtime_ns: int) -> str:
    """The first 12 hex digits of the file's SHA-256 (about 0.1 s for the 98 MB SmolLM2 file), once per process for
    a path, size and modification time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:12]


def _stat(directory: Path) -> tuple:
    """The copy's files as (name, size, modification time, inode): what a check in this process stands on."""
    found = []
    for path in sorted(directory.iterdir()):
        stat = path.stat()
        found.append((path.name, stat.st_size, stat.st_mtime_ns, stat.st_ino))
    return (str(directory), tuple(found))


def copy_problem(directory: Path) -> str | None:
    """What is wrong with the copy ``directory`` against its manifest, or None: no manifest, a manifest that does
    not list every file there or one of ``REQUIRED``, a file missing or of another size or SHA-256."""
    stamp = _stat(directory)
    if stamp in _SOUND:
        return None
    try:
        manifest = read_manifest(directory)
    except ValueError as err:
        return str(err)
    if manifest is None:
        return f"no {MANIFEST} (a copy made before copies carried one, or damaged)"
    listed = manifest["files"]
    unlisted = sorted(p.name for p in directory.iterdir() if p.name not in listed and p.name != MANIFEST)
    required = [name for name in REQUIRED if name not in listed]
    if required or unlisted:
        return f"{MANIFEST} does not list {required[0]}" if required else f"{unlisted[0]} is not in {MANIFEST}"
    problem = damage(directory)
    if problem is None:
        _SOUND.add(stamp)
    return problem


def writable(folder: Path) -> bool:
    """Whether copies can be written into (and removed from) ``folder``, or the folder it would be created in."""
    return os.access(existing_ancestor(folder), os.W_OK | os.X_OK)


def read_only_refusal(directory: Path, problem: str) -> str:
    """The message for a damaged copy that cannot be removed: what is wrong and what to do."""
    return (
        f"the converted model {directory} is damaged ({problem}) and cannot be removed to be made again: the model "
        f"cache {directory.parent} is read-only here. Delete {directory} (it is made again from its source), or set "
        "GKV_TRAIN_CACHE to a writable folder"
    )


def check_copy(directory: Path) -> None:
    """Before any work: PermissionError (``read_only_refusal``) when ``directory`` holds a damaged copy that cannot
    be removed; else nothing (a sound copy is used, a damaged one made again by ``sound_copy``)."""
    if directory.is_dir() and not writable(directory.parent):
        problem = copy_problem(directory)
        if problem is not None:
            raise PermissionError(read_only_refusal(directory, problem))


def sound_copy(directory: Path) -> bool:
    """True when ``directory`` holds a sound copy; False when it holds none (a damaged one is removed, with a warning
    naming it and what is wrong, to be made again). PermissionError (``read_only_refusal``) when a damaged copy
    cannot be removed: it is never loaded, and nothing is converted."""
    if not directory.is_dir():
        return False
    problem = copy_problem(directory)
    if problem is None:
        return True
    if not writable(directory.parent):
        raise PermissionError(read_only_refusal(directory, problem))
    log.warning("the converted model %s is damaged (%s); it is removed and made again", directory, problem)
    shutil.rmtree(directory, ignore_errors=True)
    if directory.exists():
        raise PermissionError(read_only_refusal(directory, problem))
    return False


def save_copy(directory: Path, objects: list, source: dict) -> bool:
    """``save_pretrained`` each of ``objects`` into a temporary folder beside ``directory``, the manifest last
    (``source``: what the copy was made from, kept in it), then rename it into place. True when ``directory`` holds
    a copy afterwards (this one, or another process's that was renamed first); False, with a warning, when the
    cache is not writable (the model then lives in memory only). A full disk or the file-size limit:
    ``gkv_train.storage.DiskFull`` naming the copy and the limit. Nothing half-written stays, on any failure
    or interruption (a killed process's folder: ``remove_stale_temporaries``)."""
    if not writable(directory.parent):
        log.warning(
            "the model cache %s is not writable: the converted model %s is not kept, so every load converts it "
            "again; set GKV_TRAIN_CACHE to a writable folder",
            directory.parent,
            directory.name,
        )
        return False
    tmp = directory.with_name(directory.name + f".tmp{os.getpid()}")
    try:
        with naming_full_disk(directory, f"the converted model {directory.name} (the model cache, GKV_TRAIN_CACHE)"):
            directory.parent.mkdir(parents=True, exist_ok=True)
            for obj in objects:
                _save(obj, tmp)
            write_manifest(tmp, [p for p in tmp.iterdir() if p.is_file()], source)
        try:
            tmp.rename(directory)
            _SOUND.add(_stat(directory))  # its manifest was just made from these files
        except OSError:  # another process's copy took the place first (checked when it is used)
            if not directory.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return True


def _save(obj, folder: Path) -> None:
    """``obj.save_pretrained(folder)``; safetensors' I/O errors (``os error 28``) raised as the OSError they are."""
    try:
        obj.save_pretrained(folder)
    except SafetensorError as err:
        code = re.search(r"os error (\d+)", str(err))
        if code is None:
            raise
        raise OSError(int(code[1]), os.strerror(int(code[1]))) from err


def remove_stale_temporaries(root: Path) -> None:
    """Delete the temporary folders (``*.tmp<pid>``) that killed conversions left in the cache ``root``."""
    for tmp in Path(root).glob("*.tmp*"):
        pid = tmp.suffix[len(".tmp") :]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True
