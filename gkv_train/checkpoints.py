"""Crash-safe training outputs: atomic checkpoints, the newest complete one, and what a run folder holds.

A checkpoint is written under ``<output_dir>/.staging/checkpoint-N`` and renamed to ``<output_dir>/checkpoint-N``
once every process has written its part, so a ``checkpoint-N`` folder is always complete; a save killed half
way (or failing on a full disk) leaves only the staging folder, removed at the next start.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path

from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import rotate_checkpoints

from gkv_train.jsonio import dumps, read_jsonl, write_atomically

STAGING = ".staging"
METRICS = "metrics.jsonl"
EVAL = "eval.json"
TRACES = "traces.jsonl"
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")
# What a training run leaves in its output folder (besides Hydra's own ``hydra/``): removed by overwrite=true.
RUN_FILES = (
    "checkpoint-*", STAGING, METRICS, EVAL, TRACES, "runs", "README.md", "*.safetensors", "*.bin", "*.pt",
    "adapter_config.json", "config.json", "generation_config.json", "tokenizer*", "special_tokens_map.json",
    "chat_template.jinja",
)


def complete_checkpoints(output_dir: Path) -> list[Path]:
    """The complete ``checkpoint-N`` folders of ``output_dir`` (those holding a trainer state), oldest first."""
    output_dir = Path(output_dir)
    found = []
    if output_dir.is_dir():
        for path in output_dir.iterdir():
            match = _CHECKPOINT.fullmatch(path.name)
            if match and path.is_dir() and (path / TRAINER_STATE_NAME).is_file():
                found.append((int(match[1]), path))
    return [path for _, path in sorted(found)]


def checkpoint_step(checkpoint: Path) -> int:
    """The global step a checkpoint was saved at."""
    return json.loads((Path(checkpoint) / TRAINER_STATE_NAME).read_text())["global_step"]


def run_artefacts(output_dir: Path, keep: Path | None = None) -> list[str]:
    """Names of what a previous run left in ``output_dir`` (checkpoints, metrics, evaluation, generated traces),
    sorted; ``keep`` (an input of this run, such as a given traces file) does not count."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    marks = ("checkpoint-*", STAGING, METRICS, EVAL, TRACES)
    found = {p for pattern in marks for p in output_dir.glob(pattern)}
    return sorted(p.name for p in found if keep is None or p.resolve() != Path(keep).resolve())


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
    """Within the block, ``model``'s config names its base ``name`` (None: unchanged): what TRL's model card reads."""
    before = model.config._name_or_path
    if name is not None:
        model.config._name_or_path = name
    try:
        yield
    finally:
        model.config._name_or_path = before


def name_adapter_base(folder: Path, name: str | None) -> None:
    """Set ``base_model_name_or_path`` of a saved LoRA adapter (``adapter_config.json``) to ``name``."""
    path = Path(folder) / "adapter_config.json"
    if name is None or not path.is_file():
        return
    config = json.loads(path.read_text())
    config["base_model_name_or_path"] = name
    write_atomically(path, json.dumps(config, indent=2, sort_keys=True) + "\n")


class AtomicCheckpoints:
    """Mixin for a transformers ``Trainer``: checkpoints are staged and renamed into place when complete, and
    saved files (adapter config, model card) name the base model as the user did, not the local folder it was
    loaded from (which the model's config keeps: TRL's reference model and PEFT read it during training)."""

    _staging = False
    base_model_name: str | None = None  # written into saved adapters (the name this project loads)
    card_base_model: str | None = None  # written into model cards (a hub id where there is one)

    def _save(self, output_dir=None, state_dict=None) -> None:
        super()._save(output_dir, state_dict)  # PEFT reads the (local) base folder while saving
        if self.args.should_save:
            name_adapter_base(output_dir or self.args.output_dir, self.base_model_name)

    base_weights_note: str | None = None  # appended to the model card (where the base weights are not the hub's)

    def create_model_card(self, *args, **kwargs) -> None:
        with card_base(self.accelerator.unwrap_model(self.model), self.card_base_model):
            super().create_model_card(*args, **kwargs)
        card = Path(self.args.output_dir) / "README.md"
        if self.args.should_save and self.base_weights_note and card.is_file():
            write_atomically(card, card.read_text().rstrip("\n") + "\n\n" + self.base_weights_note)

    def _get_output_dir(self, trial) -> str:
        run_dir = super()._get_output_dir(trial)
        return os.path.join(run_dir, STAGING) if self._staging else run_dir

    def _save_checkpoint(self, model, trial) -> None:
        run_dir = Path(super()._get_output_dir(trial))
        name = f"checkpoint-{self.state.global_step}"
        self._staging = True
        try:
            super()._save_checkpoint(model, trial)
        except BaseException:  # e.g. a full disk: nothing half-written stays behind
            if self.args.should_save:
                clear_staging(run_dir)
            raise
        finally:
            self._staging = False
        self.accelerator.wait_for_everyone()  # every process has written its part (RNG states, shards)
        if self.args.should_save:
            publish(run_dir / STAGING / name, run_dir / name)
            clear_staging(run_dir)
            rotate_checkpoints(
                output_dir=str(run_dir), save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=False,
            )
        self.accelerator.wait_for_everyone()
