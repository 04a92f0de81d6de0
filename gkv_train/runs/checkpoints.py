"""Crash-safe training outputs: atomic checkpoints, the newest complete one, what a run folder holds, and a clean
stop on SIGTERM / SIGINT.

A checkpoint is written under ``<output_dir>/.staging/checkpoint-N`` and renamed to ``<output_dir>/checkpoint-N``
once every process has written its part, so a ``checkpoint-N`` folder is always complete; a save killed half
way (or failing on a full disk, which the error names with the space free and needed) leaves only the staging
folder, removed at the next start. Each checkpoint, and the final model in the run folder, carries a manifest
(``gkv_train.manifest``), so a file damaged later (truncated, overwritten) is found before it is loaded:
``resume=last`` passes over a damaged checkpoint to the one before, saying so. ``StopOnSignal`` ends training at a
step boundary with such a checkpoint.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shutil
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import TrainerCallback
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import rotate_checkpoints

from gkv_train.exits import Preempted
from gkv_train.jsonio import dumps, read_jsonl, read_state, write_atomically
from gkv_train.manifest import CHECKPOINT, MANIFEST, damage, write_manifest
from gkv_train.storage import FULL, disk_full, free_bytes

STAGING = ".staging"
METRICS = "metrics.jsonl"
EVAL = "eval.json"
TRACES = "traces.jsonl"
TRAIN_LOG = "train.log"
# What a training run leaves in its output folder (besides its resolved configuration, ``hydra/``, rewritten at each
# start, and the lock file ``.run.lock``): removed by overwrite=true.
RUN_FILES = (
    "checkpoint-*",
    STAGING,
    MANIFEST,
    METRICS,
    EVAL,
    TRACES,
    "runs",
    "README.md",
    "*.safetensors",
    "*.safetensors.index.json",
    "*.bin",
    "*.bin.index.json",
    "*.pt",
    "adapter_config.json",
    "config.json",
    "generation_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "chat_template.jinja",
)


# What only a training run leaves in its folder, so that a folder holding one of them is a training run's (a traces
# file is not: ``scripts/generate_traces.py`` writes those anywhere)
RUN_MARKS = ("checkpoint-*", STAGING, METRICS, MANIFEST, EVAL, TRAIN_LOG)


# The model files of a run folder (what ``save_model`` writes there), listed by the final model's manifest
MODEL_FILES = (
    "*.safetensors",
    "*.safetensors.index.json",  # a sharded model's index: which shard holds which tensor
    "*.bin",
    "*.bin.index.json",
    "adapter_config.json",
    "config.json",
    "generation_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def complete_checkpoints(output_dir: Path) -> list[Path]:
    """The complete ``checkpoint-N`` folders of ``output_dir`` (those holding a trainer state), oldest first."""
    output_dir = Path(output_dir)
    found = []
    if output_dir.is_dir():
        for path in output_dir.iterdir():
            match = CHECKPOINT.fullmatch(path.name)
            if match and path.is_dir() and (path / TRAINER_STATE_NAME).is_file():
                found.append((int(match[1]), path))
    return [path for _, path in sorted(found)]


def newest_whole_checkpoint(output_dir: Path) -> Path | None:
    """The newest complete checkpoint of ``output_dir`` whose files are whole (``damage``); each damaged newer one
    is passed over with a line on stderr saying what is wrong with it."""
    for checkpoint in reversed(complete_checkpoints(output_dir)):
        problem = damage(checkpoint)
        if problem is None:
            return checkpoint
        print(
            f"warning: {checkpoint.name} is damaged ({problem}): passed over for the checkpoint before it",
            file=sys.stderr,
        )
    return None


def checkpoint_step(checkpoint: Path) -> int:
    """The global step a checkpoint was saved at."""
    return read_state(Path(checkpoint) / TRAINER_STATE_NAME)["global_step"]


def run_artefacts(output_dir: Path) -> list[str]:
    """Names of what marks ``output_dir`` as a training run's folder (``RUN_MARKS``: checkpoints, an interrupted
    save, metrics, the final model's manifest, the evaluation, the console log), sorted."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    return sorted({p.name for pattern in RUN_MARKS for p in output_dir.glob(pattern)})


def clear_run(output_dir: Path, keep: Path | None = None) -> None:
    """Remove everything a training run writes (``RUN_FILES``) from ``output_dir``, except ``keep`` (an input
    such as a given traces file); other files stay."""
    for pattern in RUN_FILES:
        for path in Path(output_dir).glob(pattern):
            if keep is not None and path.resolve() == Path(keep).resolve():
                continue
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def clear_staging(output_dir: Path) -> None:
    """Remove what interrupted checkpoint saves left behind."""
    shutil.rmtree(Path(output_dir) / STAGING, ignore_errors=True)


def truncate_metrics(path: Path, step: int) -> None:
    """Drop the records logged after ``step`` (a resumed run logs those steps again), so no step is logged twice;
    damaged lines go too."""
    if Path(path).is_file():
        kept = [r for r in read_jsonl(path) if r.get("step", 0) <= step]
        write_atomically(path, "".join(dumps(r) + "\n" for r in kept))


def publish(staged: Path, final: Path) -> None:
    """Move a completely written checkpoint into place (a rename: atomic on one file system)."""
    if final.exists():  # the same step saved again: the old copy goes only once the new one is complete
        old = staged.with_name(staged.name + ".old")
        os.replace(final, old)
        os.replace(staged, final)
        shutil.rmtree(old)
    else:
        os.replace(staged, final)


@contextmanager
def card_base(model, name: str | None):
    """Within the block, ``model``'s config and its base model's ``name_or_path`` (a copy taken when the model was
    built, which PEFT's model-card tags read) name its base ``name`` (None: unchanged): what the model cards
    TRL and PEFT write read."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    before = model.config._name_or_path, base.__dict__.get("name_or_path")
    if name is not None:
        model.config._name_or_path = base.name_or_path = name
    try:
        yield
    finally:
        model.config._name_or_path, base.name_or_path = before


def name_adapter_base(folder: Path, name: str | None) -> None:
    """Set ``base_model_name_or_path`` of a saved LoRA adapter (``adapter_config.json``) to ``name``."""
    path = Path(folder) / "adapter_config.json"
    if name is None or not path.is_file():
        return
    config = json.loads(path.read_text())
    config["base_model_name_or_path"] = name
    write_atomically(path, json.dumps(config, indent=2, sort_keys=True) + "\n")


# TrainingArguments fields a resumed run takes from its checkpoint's optimizer and scheduler state, whatever the new
# configuration says (so a different value would be silently ignored)
RESUME_SETTINGS = (
    "learning_rate",
    "lr_scheduler_type",
    "lr_scheduler_kwargs",
    "warmup_steps",
    "warmup_ratio",
    "optim",
    "optim_args",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
)


def resume_settings(args, model: str | None, peft_config=None) -> dict:
    """The settings of ``RESUME_SETTINGS`` of trainer arguments ``args``, the base ``model``, the LoRA
    configuration (``peft_config``: PEFT's, by adapter name) and what the rollouts ran under (the compression, by
    its flat settings, RL-Sparse's options and the training task, ``data.name`` / ``data.path``, where ``args`` has
    them: a run resumed under another method would mix two policies' rollouts, on another task two tasks), as plain
    values."""
    found = {name: getattr(args, name, None) for name in RESUME_SETTINGS}
    found = json.loads(dumps({k: v.value if hasattr(v, "value") else v for k, v in found.items()}))
    lora = None
    if peft_config:
        config = next(iter(peft_config.values()))
        lora = {"r": config.r, "alpha": config.lora_alpha, "target_modules": sorted(config.target_modules)}
    rollouts = {}
    if getattr(args, "compression", None) is not None:
        rollouts["compression"] = json.loads(dumps(args.compression.identity()))
    if getattr(args, "rl", None) is not None:
        rollouts["rl"] = json.loads(dumps(dataclasses.asdict(args.rl)))
    if getattr(args, "data", None) is not None:  # the task: a run resumed on another would train two
        rollouts["data"] = {"name": args.data.name, "path": args.data.path}
    return {**found, "model": model, "lora": lora, **rollouts}


class AtomicCheckpoints:
    """Mixin for a transformers ``Trainer``: checkpoints are staged and renamed into place when complete, and
    saved files (adapter config, model card) name the base model as the user did, not the local folder it was
    loaded from (which the model's config keeps: TRL's reference model and PEFT read it during training)."""

    _staging = False
    base_model_name: str | None = None  # written into saved adapters (the name this project loads)
    card_base_model: str | None = None  # written into model cards (a hub id where there is one)

    def _save(self, output_dir=None, state_dict=None) -> None:
        # PEFT's model card (README.md) names the base from the model's config: the user's name is set before it
        # writes; the adapter's own base_model_name_or_path stays the local folder while PEFT saves (it reads the
        # base's config.json there to tell whether the embeddings were resized) and is renamed once written
        with card_base(self.accelerator.unwrap_model(self.model), self.card_base_model):
            super()._save(output_dir, state_dict)
        if self.args.should_save:
            name_adapter_base(output_dir or self.args.output_dir, self.base_model_name)

    base_weights_note: str | None = None  # appended to the model card (where the base weights are not the hub's)

    def create_model_card(self, *args, **kwargs) -> None:
        with card_base(self.accelerator.unwrap_model(self.model), self.card_base_model):
            super().create_model_card(*args, **kwargs)
        card = Path(self.args.output_dir) / "README.md"
        if self.args.should_save and card.is_file():
            text = card.read_text().replace('model="None"', f'model="{self.args.output_dir}"')  # TRL's hub id: none
            if self.base_weights_note:
                text = text.rstrip("\n") + "\n\n" + self.base_weights_note
            write_atomically(card, text)

    def _get_output_dir(self, trial) -> str:
        run_dir = super()._get_output_dir(trial)
        return os.path.join(run_dir, STAGING) if self._staging else run_dir

    def resume_settings(self) -> dict:
        """What a checkpoint's saved state was made with and a resumed run keeps whatever it is told
        (``RESUME_SETTINGS``: the optimizer's and scheduler's settings, the base model, LoRA)."""
        return resume_settings(self.args, self.base_model_name, getattr(self.model, "peft_config", None))

    def save_final(self, output_dir: str) -> None:
        """The final model into ``output_dir`` (``save_model``), with its manifest."""
        self.save_model(output_dir)
        if self.args.should_save:
            folder = Path(output_dir)
            files = {f for pattern in MODEL_FILES for f in folder.glob(pattern) if f.is_file()}
            write_manifest(folder, list(files), self.resume_settings())

    def checkpoint_bytes(self) -> int:
        """About how much a checkpoint takes: the newest complete one's size, else the weights plus two optimizer
        states (Adam's) of the trainable ones."""
        found = complete_checkpoints(self.args.output_dir)
        if found:
            return sum(f.stat().st_size for f in found[-1].rglob("*") if f.is_file())
        params = list(self.model.parameters())
        return sum(p.numel() * p.element_size() for p in params) + 8 * sum(p.numel() for p in params if p.requires_grad)

    def _save_checkpoint(self, model, trial) -> None:
        run_dir = Path(super()._get_output_dir(trial))
        name = f"checkpoint-{self.state.global_step}"
        self._staging = True
        try:
            super()._save_checkpoint(model, trial)
        except BaseException as err:  # e.g. a full disk: nothing half-written stays behind
            full = self._disk_full(err, run_dir / STAGING / name)  # before the staged files are gone
            if self.args.should_save:
                clear_staging(run_dir)
            if full is not None:
                raise full from err
            raise
        finally:
            self._staging = False
        self.accelerator.wait_for_everyone()  # every process has written its part (RNG states, shards)
        if self.args.should_save:
            staged = run_dir / STAGING / name
            write_manifest(staged, [f for f in staged.rglob("*") if f.is_file()], self.resume_settings())
            publish(staged, run_dir / name)
            clear_staging(run_dir)
            rotate_checkpoints(
                output_dir=str(run_dir),
                save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=False,
            )
        self.accelerator.wait_for_everyone()

    def _disk_full(self, err: BaseException, staged: Path):
        """The ``DiskFull`` error naming the disk when a save failed for lack of space, else None: an OSError
        saying so, safetensors' writer saying so (``... (os error 28)``: its error carries no errno), or a write
        error of torch's C++ writer (``basic_ios::clear: iostream error``, no errno) with less space free than a
        checkpoint needs."""
        needed = self.checkpoint_bytes()
        written = re.search(r"\(os error (\d+)\)", str(err))
        code = err.errno if isinstance(err, OSError) else int(written[1]) if written else None
        full = code in FULL
        if not full and isinstance(err, RuntimeError) and not isinstance(err, NotImplementedError):
            full, code = free_bytes(staged) < needed, errno.ENOSPC
        return disk_full(staged, staged.name, needed, code) if full else None


class StopOnSignal(TrainerCallback):
    """SIGTERM (a scheduler's preemption) or SIGINT (Ctrl-C) during training: the handler only notes the signal
    (and says so on stderr); at the end of the optimizer step in flight every process learns whether any got one
    (``agreed``), the trainer saves a complete checkpoint of that step and stops, and the caller raises
    ``preempted(...)``. Outside the training loop (loading, the final save and evaluation) the signal stops the
    process at once with ``Preempted``: nothing since the newest complete checkpoint is lost. Further signals
    while stopping are ignored (SIGKILL stops at once; the newest complete checkpoint stays)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.received: int | None = None  # the signal this process got
        self.in_loop = False
        self.stopped_at: int | None = None  # the step whose checkpoint the stop saved
        self._previous = {}

    def __enter__(self) -> StopOnSignal:
        for signum in self.SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.received is not None:
            return
        self.received = signum
        name = signal.Signals(signum).name
        if not self.in_loop:
            raise Preempted(
                signum,
                f"stopped by {name} outside training: nothing since the newest complete "
                "checkpoint is lost; resume=last continues from it",
            )
        # os.write, not print: the handler may have interrupted a print to the same stream
        os.write(2, f"{name} received: stopping at the end of this step, with a checkpoint\n".encode())

    def agreed(self, device) -> bool:
        """Whether any process got a signal (a collective: every process calls it at the same point)."""
        flag = self.received is not None
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            any_flag = torch.tensor([int(flag)], device=device)
            dist.all_reduce(any_flag, op=dist.ReduceOp.MAX)
            flag = bool(any_flag.item())
        return flag

    def on_train_begin(self, args, state, control, **kwargs):
        self.in_loop = True

    def on_step_end(self, args, state, control, **kwargs):
        if self.agreed(args.device):
            control.should_save = control.should_training_stop = True
            self.stopped_at = state.global_step

    def on_train_end(self, args, state, control, **kwargs):
        self.in_loop = False

    def preempted(self, output_dir: Path, step: int, device) -> Preempted | None:
        """After training (every process calls it): the ``Preempted`` to raise when any process got a signal, with
        the checkpoint of ``step`` complete in ``output_dir``; else None."""
        if self.stopped_at is None and not self.agreed(device):
            return None
        signum = self.received or signal.SIGTERM  # another process got it
        name = signal.Signals(signum).name
        return Preempted(
            signum,
            f"stopped by {name} after step {step}: {Path(output_dir) / f'checkpoint-{step}'} is "
            "complete; resume=last continues from it",
        )
