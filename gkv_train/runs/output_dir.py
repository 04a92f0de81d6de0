"""A training run's folder (``output_dir``), settled before any work: what it may hold (``check_run_folder``: the rule
of every job's output, ``gkv_train.runs.outputs``), the checkpoint a resume continues (the newest whole one, or the
one named, whose settings must be this run's and which must hold its optimizer state), the folder locked for the run
(one run per folder) and prepared (checked again under the lock; what a resume logs again removed)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gkv_train.exits import Refused, RunLocked
from gkv_train.manifest import CHECKPOINT, MANIFEST, damage, missing_training_state, saved_settings
from gkv_train.models import base_model_name
from gkv_train.runs.checkpoints import (
    EVAL,
    METRICS,
    MODEL_FILES,
    checkpoint_step,
    clear_run,
    clear_staging,
    newest_whole_checkpoint,
    resume_settings,
    truncate_metrics,
)
from gkv_train.runs.outputs import check_output
from gkv_train.runs.runlock import RunLock

if TYPE_CHECKING:
    from transformers import TrainingArguments


@dataclass(frozen=True)
class RunFolder:
    """The run folder's part of a training run's configuration: where it writes (``output_dir``), the checkpoint
    it continues (``resume``: None, "last" or a checkpoint's folder; ``resume_other_run``: one of another run's
    folder allowed; ``resume_model_only``: one saved without its optimizer state allowed), whether it replaces a run
    found there (``overwrite``), a file of the user's there that is an input, not another run's (``keep``:
    distillation's traces), and the models it loads (``models``: key -> name or path; never the folder itself)."""

    output_dir: str
    resume: str | None = None
    resume_other_run: bool = False
    overwrite: bool = False
    keep: str | None = None
    resume_model_only: bool = False
    models: tuple[tuple[str, str], ...] = ()


def check_run_folder(folder: RunFolder, held: bool = False) -> None:
    """``output_dir`` by the rule of every job's output (``check_output``): not in use by another run, empty or
    missing, this run's (continued from a checkpoint of its own, ``continues_here``, or stopped before its first
    step), or ``overwrite=true``; never a model it loads. ``held``: this run holds the folder's lock (or, in another
    process of the run, its main process takes it)."""
    check_output(
        "train",
        folder.output_dir,
        "output_dir",
        overwrite=folder.overwrite,
        resume=continues_here(folder),
        inputs=dict(folder.models),
        keep=folder.keep,
        held=held,
    )


def continues_here(folder: RunFolder) -> bool:
    """Whether the run continues a checkpoint of ``output_dir`` itself (``resume=last``, or a checkpoint folder in
    it), so that a training run found there is this one. A checkpoint of another run (``resume_other_run=true``)
    starts a new run from it: a run found in ``output_dir`` is then another one (its metrics would be cut back to
    the checkpoint's step, its checkpoints written over and rotated away)."""
    if folder.resume is None:
        return False
    return folder.resume == "last" or Path(folder.resume).resolve().parent == Path(folder.output_dir).resolve()


def resume_checkpoint(
    folder: RunFolder, args: TrainingArguments | None, model: str, lora: dict | None = None
) -> str | None:
    """The checkpoint to resume from, checked before any work: ``resume=last``: the newest complete, undamaged
    one in ``output_dir`` (a damaged newer one passed over with a line; None when there is none and nothing a
    fresh start would replace, ``refuse_to_replace``); a path: that
    checkpoint, which must be complete and undamaged, and of this run's folder unless ``resume_other_run=true``.
    Either way the settings its optimizer and scheduler state were made with (``RESUME_SETTINGS``, the base
    ``model``, ``lora`` (``LoraOptions.settings``), the compression and RL-Sparse's options) must be this run's
    ``args``: a resumed run keeps the checkpoint's
    optimizer and scheduler (another value would be ignored) and goes on with its rollouts (another method would
    mix two policies' samples).
    ValueError / FileNotFoundError naming the checkpoint and what is wrong."""
    if folder.resume is None:
        return None
    if folder.resume == "last":
        found = newest_whole_checkpoint(folder.output_dir)
        if found is None:
            refuse_to_replace(Path(folder.output_dir))
            print(f"resume=last: no complete checkpoint in {folder.output_dir}, starting from scratch", file=sys.stderr)
            return None
    else:
        found = Path(folder.resume)
        if not (found / "trainer_state.json").is_file():
            raise FileNotFoundError(
                f"resume={folder.resume}: not a complete checkpoint directory (no trainer_state.json)"
            )
        problem = damage(found)
        if problem is not None:
            raise ValueError(
                f"resume={folder.resume}: the checkpoint is damaged ({problem}); resume=last takes the newest whole one"
            )
        run = found.resolve().parent
        if run != Path(folder.output_dir).resolve() and not folder.resume_other_run:
            raise ValueError(
                f"resume={folder.resume} is a checkpoint of another run ({run}), not of "
                f"output_dir={folder.output_dir}: "
                "resuming continues that run's optimizer, scheduler and step count here; to do that, add "
                "resume_other_run=true (to start a new run from its weights instead, use its folder as model=)"
            )
    check_training_state(folder, found, finished=args is not None and checkpoint_step(found) >= args.max_steps)
    saved = saved_settings(found)
    if saved is not None:
        wanted = {**resume_settings(args, base_model_name(model), None), "lora": lora}
        flat_saved, flat_wanted = flat_settings(saved), flat_settings(wanted)
        differ = [k for k in flat_wanted if k in flat_saved and flat_saved[k] != flat_wanted[k]]
        if differ:
            what = ", ".join(f"{k}={flat_saved[k]!r} there, {flat_wanted[k]!r} here" for k in differ)
            raise ValueError(
                f"resume={folder.resume}: {found.name} was trained with other settings ({what}); a resumed run "
                "continues its checkpoint's optimizer, scheduler, model and rollouts, which these would ignore or mix "
                "with others: resume with the settings it was saved with, or start a new run (overwrite=true, or "
                "another output_dir)"
            )
    return str(found)


def check_training_state(folder: RunFolder, found: Path, finished: bool = False) -> None:
    """The checkpoint ``found`` holds the optimizer and scheduler state a resumed run continues (``save_only_model=
    true`` saves none, and transformers' Trainer would start both afresh without a word), unless
    ``resume_model_only=true`` accepts that (and only then), or the run is ``finished`` (its step at ``max_steps``:
    nothing is trained, only its model is loaded, when its final save and evaluation are missing)."""
    missing = missing_training_state(found)
    if missing and not folder.resume_model_only and not finished:
        raise ValueError(
            f"resume={folder.resume}: {found} holds no optimizer or scheduler state ({', '.join(missing)} missing: "
            "saved with save_only_model=true?): a resumed run would go on from its step with a new optimizer and a "
            "learning-rate schedule from its start; to accept that, add resume_model_only=true; to start a new run "
            f"from its weights, use model={found} and another output_dir"
        )
    if folder.resume_model_only and not missing:
        raise ValueError(
            f"resume_model_only=true, but {found} holds its optimizer and scheduler state, which a resume "
            "continues: drop resume_model_only"
        )


def finished_whole(out: Path, main: bool) -> bool:
    """Whether a finished run's folder ``out`` (its newest checkpoint at ``max_steps``) holds its final results
    whole: the evaluation written and the final model as it was saved (``damage``: against its manifest, or its
    contents without one). A damaged final model (weights cut or overwritten) is named on stderr (by the ``main``
    process): the run then saves its final model from the checkpoint and evaluates it again, as one stopped before
    its final save."""
    if not (out / EVAL).is_file():
        return False
    problem = damage(out)
    if problem is not None and main:
        print(
            f"warning: the final model of {out} is damaged ({problem}): it is saved again from the finished run's last "
            "checkpoint and evaluated again",
            file=sys.stderr,
        )
    return problem is None


def flat_settings(settings: dict) -> dict:
    """``resume_settings``' groups (compression, rl, data) by dotted key as the configuration writes them
    (``compression.alpha``), the rest as they are: a difference is named by the one key that differs."""
    found = {}
    for key, value in settings.items():
        if key in ("compression", "rl", "data") and isinstance(value, dict):
            for name, v in value.items():
                found[f"{key}.{name}"] = v
        else:
            found[key] = value
    return found


def refuse_to_replace(out: Path) -> None:
    """``resume=last`` found no whole checkpoint in ``out``: a ValueError when starting from scratch would replace a
    run's results there (its ``checkpoint-N`` folders, every one damaged, each named with what is wrong; the final
    model, its manifest, the evaluation); a folder with only what a run stopped before its first checkpoint leaves
    (metrics, logs, staging) starts from scratch."""
    if not out.is_dir():
        return
    problems = []
    for path in sorted(out.iterdir(), key=lambda p: (len(p.name), p.name)):
        if CHECKPOINT.fullmatch(path.name):
            problem = damage(path) if path.is_dir() else "not a folder"
            problems.append(f"{path.name}: {problem or 'no trainer state'}")
    kept = sorted({f.name for pattern in (*MODEL_FILES, MANIFEST, EVAL) for f in out.glob(pattern)})
    if not problems and not kept:
        return
    held = "; ".join(problems) if problems else "no checkpoint"
    also = f", and it holds a run's results ({', '.join(kept)})" if kept else ""
    raise ValueError(
        f"resume=last: {out} has no whole checkpoint to resume from ({held}){also}; starting from scratch would "
        "replace them: restore a checkpoint, pass overwrite=true (without resume) to start again, or choose "
        "another output_dir"
    )


def prepare_output_dir(folder: RunFolder, state, checkpoint: str | None) -> None:
    """Get ``output_dir`` (checked before any work, and locked) ready to resume from ``checkpoint``
    (``resume_checkpoint``): checked again under the lock (``check_run_folder``: a run that ended meanwhile is not
    written over); with ``overwrite=true`` a run's files there are removed (other files stay); on resume, metrics
    logged after the checkpoint and staging leftovers are removed, so no step is logged twice. Every process decides
    the same; only the main one changes files.
    """
    out = Path(folder.output_dir)
    check_run_folder(folder, held=True)
    state.wait_for_everyone()  # every process has looked before anything changes
    if state.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        if folder.overwrite:
            clear_run(out, keep=folder.keep)
        else:
            clear_staging(out)
            truncate_metrics(out / METRICS, checkpoint_step(checkpoint) if checkpoint else 0)
    state.wait_for_everyone()


def lock_output_dir(out: Path, state) -> RunLock | None:
    """The main process creates ``out`` and locks it for this run (``RunLock``: one run per folder); every process
    learns the outcome, and all raise the same ``Refused`` when it failed (another run holds the folder, or it
    cannot be created). Returns the lock (None in the other processes)."""
    lock, refusal = None, None
    if state.is_main_process:
        try:
            out.mkdir(parents=True, exist_ok=True)
            lock = RunLock.acquire(out, "output_dir")
        except (OSError, RunLocked) as err:
            refusal = str(err)
    if state.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        refusal = broadcast_object_list([refusal])[0]
    if refusal is not None:
        raise Refused(refusal)
    return lock
