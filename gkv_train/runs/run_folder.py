"""An evaluation run's folder: the fingerprint of its settings, claiming it before any work (a folder of other
settings is refused, naming what differs), and which of its batches are finished (resume)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from gkv_train.jsonio import dumps, read_jsonl, read_state, write_atomically

RUN_SETTINGS = "run.json"
RUN_FILES = ("samples.jsonl", "density.jsonl", "summary.json", RUN_SETTINGS)
EVALUATION_LOG = "evaluate.log"
LM_EVAL_RESULTS = "results.json"  # an evaluation's results in lm-evaluation-harness's layout


def evaluation_marks(folder: Path) -> list[str]:
    """Names of what marks ``folder`` as an evaluation's (its console log, its ``results.json``, a run's folder
    with its settings), sorted."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    marks = (EVALUATION_LOG, LM_EVAL_RESULTS)
    return sorted(p.name for p in folder.iterdir() if p.name in marks or (p / RUN_SETTINGS).is_file())


def fingerprint(settings: dict) -> str:
    """A short hash of a run's settings (``EvalConfig.run_settings``)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two nested settings dicts."""
    keys = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            keys.append(prefix + key)
    return keys


def claim_run_dir(out_dir: Path, settings: dict, overwrite: bool, keys: dict[str, str] | None = None) -> None:
    """Make ``out_dir`` the folder of the run with ``settings`` (before any work): a folder of the same run is
    kept (its finished batches are reused); one holding results made otherwise (other model weights, data,
    sampling, compression, ...; or of unknown origin) is refused, naming what differs (by the configuration's key
    where ``keys`` maps a settings entry to one), unless ``overwrite`` (then its results are deleted)."""
    out_dir = Path(out_dir)
    settings = json.loads(dumps(settings))  # as it reads back (tuples as lists), for a fair comparison
    recorded = out_dir / RUN_SETTINGS
    try:
        old = read_state(recorded) if recorded.is_file() else None
    except ValueError:  # cut by an interruption, or not this file: of unknown origin
        old = None
    has_results = any((out_dir / name).is_file() for name in RUN_FILES)
    same = old is not None and old.get("fingerprint") == fingerprint(settings)
    if has_results and not same:
        if not overwrite:
            what = (
                "results of unknown settings"
                if old is None
                else (
                    "results made with other "
                    + ", ".join(
                        (keys or {}).get(k, k)
                        for k in differences(
                            old.get("settings") if isinstance(old.get("settings"), dict) else {}, settings
                        )
                    )
                )
            )
            raise FileExistsError(
                f"{out_dir} holds {what}: choose another output_dir, or pass overwrite=true to replace them"
            )
    if overwrite or not same:
        for name in RUN_FILES:
            (out_dir / name).unlink(missing_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(recorded, dumps({"fingerprint": fingerprint(settings), "settings": settings}, indent=2))


def finished_batches(samples_path: Path, density_path: Path, batches: list, n: int) -> set[int]:
    """Indices of the batches whose samples (parseable, once each) and density are all written. Both files are
    rewritten to hold only those batches, so damaged or partial batches (each bad line is reported with file
    and line) are recomputed."""
    samples = read_jsonl(samples_path)
    written: dict[int, int] = {}
    for line in samples:
        written[line.get("batch")] = written.get(line.get("batch"), 0) + 1
    # a re-run batch's line replaces the old; lines of an older format (no "kept") count as missing
    densities = {r.get("batch"): r for r in read_jsonl(density_path) if "kept" in r}
    done = {i for i, rows in enumerate(batches) if written.get(i) == len(rows) * n and i in densities}
    redo = sorted(b for b in written if b not in done)
    if redo:
        print(f"{samples_path}: batches {redo} are incomplete or damaged and are recomputed", file=sys.stderr)
    if samples_path.is_file() or density_path.is_file():
        write_atomically(samples_path, "".join(dumps(s) + "\n" for s in samples if s.get("batch") in done))
        write_atomically(density_path, "".join(dumps(densities[b]) + "\n" for b in sorted(done)))
    return done
