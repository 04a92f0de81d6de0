"""Where a job may write, checked before any work (no model loaded, nothing written) by every job that writes:
training and evaluation (``output_dir``, a folder), teacher traces (``output``, a file) and export (``OUT_DIR``).

One rule (``check_output``): an output that another live run holds is refused, naming it; otherwise it is written
only when it is missing or empty (lock files aside), when it holds this same job's run, or when the user says to
replace what is there (``overwrite=true``; export: ``--overwrite``). Whatever the flag, an output that is, holds or
lies inside a model the job reads is refused (its weights would be written over or removed), and so is a training
run's folder for every job but training (its configuration, model or metrics would be replaced), and an empty
name. "This same run", by job:

* train: a training run's folder (``run_artefacts``) with ``resume`` given (the checkpoint and its settings are then
  checked by ``resume_checkpoint``), or one where a run stopped before its first step (its configuration and
  console log only: nothing of it is lost);
* evaluate: an evaluation's folder (``evaluation_marks``): each run's own folder in it keeps its results only for
  the same settings (``claim_run_dir`` names what differs);
* traces: none: a call generates every trace again (nothing is resumed), so an existing file is replaced only with
  ``overwrite=true``;
* export: none: an export is written whole, so a folder that is not empty is replaced only with ``--overwrite``.
"""

from __future__ import annotations

from pathlib import Path

from gkv_train.models import BUILTIN_MODELS
from gkv_train.runs.checkpoints import TRAIN_LOG, run_artefacts
from gkv_train.runs.run_folder import evaluation_marks
from gkv_train.runs.runlock import RunLock, is_lock_file
from gkv_train.runs.storage import check_output_dir, check_output_file

# what each job writes into its folder (named in a refusal: the files a user's folder would lose)
WRITES = {
    "train": "its model (*.safetensors, config.json, tokenizer files), model card (README.md), hydra/config.yaml, "
    "train.log, metrics and checkpoints",
    "evaluate": "summary.json, results.json, hydra/config.yaml, evaluate.log, figures and a folder per compression",
    "export": "a model (*.safetensors, config.json, tokenizer files) and its card (README.md)",
}
# what a training run that stopped before its first step leaves: nothing a new start loses
STARTED = {"hydra", TRAIN_LOG}
SHOWN = 5  # file names a refusal shows


def check_output(
    job: str,
    path: str,
    key: str,
    *,
    overwrite: bool = False,
    resume: bool = False,
    inputs: dict[str, str | None] | None = None,
    keep: str | None = None,
    flag: str = "overwrite=true",
    held: bool = False,
) -> None:
    """Whether ``job`` (train, evaluate, export: a folder; traces: a file) may write ``path`` (given as ``key``),
    by the module's rule; ValueError / FileExistsError naming the folder or file, a few of the files there, and
    ``flag`` where it would allow it. ``overwrite``: the user's ``flag``; ``resume``: a training run continues a
    checkpoint; ``inputs``: what the job reads (key -> a model's name or path; hub and built-in names are no
    paths); ``keep``: a file of the folder that is an input (distillation's given traces). An output another live
    run holds is refused first, naming that run (``RunLock.check_free``), unless the caller holds its lock (``held``:
    the check again under the lock)."""
    if not str(path).strip():
        what = "file" if job == "traces" else "folder"
        raise ValueError(
            f"{key} is empty: name the {what} to write (the current folder is written only when named: {key}=.)"
        )
    out = Path(path).expanduser()
    for name, given in (inputs or {}).items():
        clash = overlap(out, given)
        if clash is not None:
            raise ValueError(
                f"{key}={path} {clash} {name}={given}: {job} would write over the model it reads (refused whatever "
                f"{flag} says): choose another {key}"
            )
    if job == "traces":
        check_output_file(out, key)
        if not held:
            RunLock.check_free(out, key, file=True)
        check_file(out, key, overwrite)
    else:
        check_output_dir(out, key)
        if not held and out.is_dir():
            RunLock.check_free(out, key)
        check_folder(job, out, key, overwrite, resume, keep, flag)


def overlap(out: Path, given: str | None) -> str | None:
    """How the output ``out`` and a model ``given`` on this machine overlap ("is", "lies inside", "holds"), or
    None (apart, or ``given`` names no local path: a built-in or hub model)."""
    if not given or given in BUILTIN_MODELS or not Path(given).expanduser().exists():
        return None
    source, target = Path(given).expanduser().resolve(), out.resolve()
    if source == target:
        return "is"
    if source in target.parents:
        return "lies inside"
    return "holds" if target in source.parents else None


def shown(names: list[str]) -> str:
    """A few of ``names``, and how many more."""
    more = f", and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def check_folder(job: str, out: Path, key: str, overwrite: bool, resume: bool, keep: str | None, flag: str) -> None:
    """The rule for a job's folder ``out`` (see ``check_output``)."""
    if not out.is_dir():
        return
    kept = Path(keep).resolve() if keep else None
    present = sorted(p.name for p in out.iterdir() if not is_lock_file(p.name) and p.resolve() != kept)
    if not present:
        return
    trained = run_artefacts(out)
    if trained and job == "train":
        if resume or overwrite or set(present) <= STARTED:
            return
        raise FileExistsError(
            f"{key} {out} holds another run ({shown(trained)}): pass resume=last to continue it, overwrite=true to "
            f"replace it, or choose another {key}"
        )
    if trained:
        raise FileExistsError(
            f"{key} {out} is a training run's folder ({shown(trained)}): {job} would write {WRITES[job]} into it, "
            f"replacing the run's own files of those names, {flag} or not: choose another {key} (a new or empty "
            "folder)"
        )
    if job == "evaluate" and evaluation_marks(out):
        return
    if overwrite:
        return
    holds = {"train": " and holds no training run", "evaluate": " and holds no evaluation"}.get(job, "")
    raise FileExistsError(
        f"{key} {out} is not empty ({shown(present)}){holds}: {job} writes {WRITES[job]} there, replacing files of "
        f"those names; choose a new or empty {key}, or pass {flag} to write into it"
    )


def check_file(out: Path, key: str, overwrite: bool) -> None:
    """The rule for the traces file ``out``: never in a training run's folder; an existing file only with
    ``overwrite``."""
    folder = out.parent
    trained = run_artefacts(folder)
    if trained:
        raise FileExistsError(
            f"{key}={out} lies in a training run's folder {folder} ({shown(trained)}), whose files (its model, "
            "metrics, its own traces.jsonl) a traces file would replace, overwrite=true or not: choose a file "
            "elsewhere"
        )
    if out.exists() and not overwrite:
        raise FileExistsError(
            f"{key}={out} exists: a call generates every trace again and replaces the whole file (traces are not "
            f"resumed); pass overwrite=true to replace it, or choose another {key}"
        )
