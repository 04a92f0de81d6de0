"""Where a job may write, checked before any work (no model loaded, nothing written) by every job that writes:
training and evaluation (``output_dir``, a folder), teacher traces (``output``, a file) and export (``OUT_DIR``).

One rule (``check_output``): an output that another live run holds is refused, naming it; otherwise it is written
only when it is missing or empty (lock files aside), when it holds this same job's run, or when the user says to
replace what is there (``overwrite=true``; export: ``--overwrite``). Refused whatever the flag: an empty name; an
output that is or holds a model the job reads (its weights would be written over or removed), and a traces file in
a model's folder (among its own files); an output in a training run's folder, at any depth (its checkpoints, model,
configuration and metrics are that run's: resume, export and evaluation read them); and a training run's folder
for every job but training. A new folder inside a model's folder that is no training run's is allowed: a model's
files are those of its own folder, none below it. The path is taken as the job writes it, never expanded here
(the configurations expand a leading ``~`` once, so that every reader sees one path; ``./~/x`` is a folder ``~``);
the models read are expanded as ``gkv_train.models`` reads them. "This same run", by job:

* train: a training run's folder (``run_artefacts``) continued from a checkpoint of its own (``resume``: resume=last,
  or a checkpoint in it; the checkpoint and its settings are then checked by ``resume_checkpoint``; a checkpoint of
  another run starts a new one, whose folder is new or empty), or one where a run stopped before its first step
  (its configuration and console log, or either: nothing of it is lost);
* evaluate: an evaluation's folder (``evaluation_marks``): each run's own folder in it keeps its results only for
  the same settings (``claim_run_dir`` names what differs);
* traces: none: a call generates every trace again (nothing is resumed), so an existing file is replaced only with
  ``overwrite=true``;
* export: none: an export is written whole, so a folder that is not empty is replaced only with ``--overwrite``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gkv_train.models import BUILTIN_MODELS
from gkv_train.runs.checkpoints import TRAIN_LOG, run_artefacts
from gkv_train.runs.run_folder import evaluation_marks
from gkv_train.runs.runlock import RunLock, is_lock_file
from gkv_train.storage import check_output_dir, check_output_file

# what each job writes into its folder (named in a refusal: the files a user's folder would lose)
WRITES = {
    "train": "its model (*.safetensors, config.json, tokenizer files), model card (README.md), hydra/config.yaml, "
    "train.log, metrics and checkpoints",
    "evaluate": "summary.json, results.json, hydra/config.yaml, evaluate.log, figures and a folder per compression",
    "export": "a model (*.safetensors, config.json, tokenizer files) and its card (README.md)",
}
# what a training run that stopped before its first step leaves (launch.run writes hydra/ first, then train.log):
# nothing a new start loses
STARTED = {"hydra", TRAIN_LOG}
# what an interrupted export leaves in its folder (the model it was saving): its own, replaced by the next export
EXPORT_STAGING = ".export-staging"
SHOWN = 5  # file names a refusal shows
# why an output that overlaps a model the job reads is refused (``overlap``'s answers)
CLASH = {
    "is": "{job} would write over the model it reads",
    "holds": "{job} would write over the model it reads (or remove it: overwrite clears the folder's run files)",
    "lies inside": "a file there replaces or joins the model's own files",
}


def slug(name: str | None) -> str:
    """A folder-name form of a model or dataset name or path: its last component, without a file suffix."""
    if not name:
        return "none"
    last = Path(str(name).rstrip("/")).name
    last = last.rsplit(".", 1)[0] if last.endswith((".gguf", ".jsonl", ".json", ".parquet")) else last
    return re.sub(r"[^A-Za-z0-9._-]+", "-", last) or "none"


def run_folder(model: str, data_name: str | None, data_path: str | None) -> str:
    """The default output sub-folder of a run: ``<model>_<data>`` (the ``gkv_dir`` resolver of the recipes)."""
    return f"{slug(model)}_{slug(data_name or data_path)}"


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
    checkpoint of its own folder; ``inputs``: what the job reads (key -> a model's name or path; hub and built-in
    names are no paths); ``keep``: a file of the folder that is an input (distillation's given traces). An output
    another live run holds is refused first, naming that run (``RunLock.check_free``), unless the caller holds its
    lock (``held``: the check again under the lock)."""
    what = "file" if job == "traces" else "folder"
    if not str(path).strip():
        raise ValueError(
            f"{key} is empty: name the {what} to write (the current folder is written only when named: {key}=.)"
        )
    out = Path(os.path.abspath(path))  # as the job writes it (never expanded: `./~/x` is no home folder), named whole
    for name, given in (inputs or {}).items():
        clash = overlap(job, out, given)
        if clash is not None:
            raise ValueError(
                f"{key}={path} {clash} {name}={given}: {CLASH[clash].format(job=job)} (refused whatever {flag} "
                f"says): choose another {key}"
            )
    run = training_run_above(out)
    if run is not None:
        raise FileExistsError(
            f"{key}={path} lies in a training run's folder {run} ({shown(run_artefacts(run))}), whose files (its "
            f"checkpoints, model, configuration, metrics: what resume, export and evaluation read) are that run's "
            f"alone, {flag} or not: choose a {what} outside it"
        )
    if job == "traces":
        check_output_file(out, key)
        if not held:
            RunLock.check_free(out, key, file=True)
        if out.exists() and not overwrite:
            raise FileExistsError(
                f"{key}={out} exists: a call generates every trace again and replaces the whole file (traces are not "
                f"resumed); pass overwrite=true to replace it, or choose another {key}"
            )
    else:
        check_output_dir(out, key)
        if not held and out.is_dir():
            RunLock.check_free(out, key)
        check_folder(job, out, key, overwrite, resume, keep, flag)


def overlap(job: str, out: Path, given: str | None) -> str | None:
    """How the output ``out`` of ``job`` and a model ``given`` on this machine overlap where that is refused: "is",
    "holds", or (a traces file directly in the model's folder) "lies inside"; None otherwise (apart; a new folder
    below the model's, which none of its files are; ``given`` no local path: a built-in or hub model)."""
    if not given or given in BUILTIN_MODELS:
        return None
    source = Path(os.path.expanduser(given))  # as gkv_train.models reads a model's path
    if not source.exists():
        return None
    source, target = source.resolve(), out.resolve()
    if source == target:
        return "is"
    if target in source.parents:
        return "holds"
    return "lies inside" if job == "traces" and target.parent == source else None


def training_run_above(out: Path) -> Path | None:
    """The nearest training run's folder (``run_artefacts``) that ``out`` lies in, at any depth (its checkpoints,
    its hydra/ folder, a new folder in it), or None."""
    return next((folder for folder in out.resolve().parents if run_artefacts(folder)), None)


def shown(names: list[str]) -> str:
    """A few of ``names``, and how many more."""
    more = f", and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def check_folder(job: str, out: Path, key: str, overwrite: bool, resume: bool, keep: str | None, flag: str) -> None:
    """The rule for a job's folder ``out`` (see ``check_output``)."""
    if not out.is_dir():
        return
    kept = Path(keep).resolve() if keep else None
    ours = {EXPORT_STAGING} if job == "export" else set()
    present = sorted(
        p.name for p in out.iterdir() if not is_lock_file(p.name) and p.name not in ours and p.resolve() != kept
    )
    if not present or (job == "train" and set(present) <= STARTED):
        return
    trained = run_artefacts(out)
    if trained and job == "train":
        if resume or overwrite:
            return
        raise FileExistsError(
            f"{key} {out} holds another run ({shown(trained)}): pass resume=last to continue it, overwrite=true to "
            f"replace it, or choose another {key} (a run resumed from another run's checkpoint starts in a new or "
            "empty folder)"
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
