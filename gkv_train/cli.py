"""The ``gkv-train`` command (installed with the package; works from any folder):

    gkv-train train recipe=rl_sparse [key=value ...]      # = accelerate launch train.py ... (see train.py)
    gkv-train evaluate data.name=gsm8k methods=[full,gkv]  # = python scripts/evaluate.py ...
    gkv-train traces data.name=gsm8k output=traces.jsonl   # = python scripts/generate_traces.py ...
    gkv-train check --model tiny --method gkv              # = python scripts/check_consistency.py ...
    gkv-train export RUN_DIR OUT_DIR [--overwrite]         # a run as a self-contained HF folder (LoRA merged)
    gkv-train lm-eval --model gkv --model_args method=gkv,budget=512 --tasks ...   # lm-eval under a compressed cache
    gkv-train compare --task long_recall --recipes rl_sparse rl_full --seeds 0 1 2   # recipes x seeds, intervals

``train``, ``evaluate`` and ``traces`` take Hydra overrides of the recipes shipped inside the package
(``gkv_train/recipes`` in the wheel: the repository's ``recipes/``), checked and built in one place
(``gkv_train.config.compose.configure``); ``check`` takes ``--options``. Multi-GPU
training runs under ``accelerate launch -m gkv_train.cli train ...``. Each command's work lives in the package
(``gkv_train.training.launch``, ``gkv_train.evaluation.evaluate``, ``gkv_train.evaluation.traces``,
``gkv_train.training.consistency``); the scripts in the repository call these same functions. ``compare`` trains and
evaluates recipes with seeds under one compressed rollout, several processes sharing its jobs, and reports paired
intervals (``gkv_train.evidence.command``, ``scripts/bench_rl_evidence.py``; ``gkv-train compare --help``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

from gkv_train.exits import REFUSED

USAGE = "\n\n".join(__doc__.split("\n\n")[:2])
COMMANDS = ("train", "evaluate", "traces", "check", "export", "lm-eval", "compare")


def _fail(message: str, code: int) -> NoReturn:
    """End the process with one line on stderr (from the main process of a multi-process run only)."""
    if os.environ.get("RANK", "0") == "0":
        print(message, file=sys.stderr, flush=True)
    sys.exit(code)


def quiet_upstream_warnings() -> None:
    """Filter, once per job, the upstream deprecation warnings a user of these commands cannot act on (TRL and
    PEFT call transformers' ``gradient_checkpointing*`` names, which transformers 5.x renamed)."""
    import warnings

    warnings.filterwarnings(
        "ignore", message=r"`(is_)?gradient_checkpointing\w*` is deprecated", category=FutureWarning
    )


def version_text() -> str:
    """``gkv-train --version``'s line: the three distributions' versions."""
    from importlib.metadata import version

    parts = ", ".join(f"{name} {version(name)}" for name in ("gkv-rollout", "gkv-rewards"))
    return f"gkv-train {version('gkv-train')} ({parts})"


def _job(job: str, work, before_work=None) -> None:
    """Run ``work(config, cfg, config_files)`` on ``job``'s configuration from the overrides in ``sys.argv[1:]``
    (``gkv_train.config.compose.configure``: checked and built in one place), after ``before_work(config)``.
    ``config_files`` (name -> text: the resolved configuration) are for ``work`` to write once its own checks pass;
    nothing is written before.

    A run refused before any work (a bad value, a failed check: ``Refused``) prints one line ``error: ...`` and
    exits with 2; a signal that stops it (``Preempted``) one line and 128 + the signal; a full disk ``error: ...``
    and 1 (``gkv_train.exits``). ``--help`` lists every key."""
    from gkv_train.config import compose, recipe_file

    if "--version" in sys.argv[1:]:
        print(version_text())
        return
    if any(a in ("-h", "--help") for a in sys.argv[1:]):  # every key, its type, default and help
        from gkv_train.config.keyhelp import help_text

        recipes = None
        if job == "train":
            recipes = sorted(p.stem for p in (Path(recipe_file.RECIPES) / "recipe").glob("*.yaml"))
        print(help_text(job, recipes), end="")
        return
    quiet_upstream_warnings()
    from gkv_train.console import log_records_to_stderr
    from gkv_train.exits import Preempted, Refused, refusing
    from gkv_train.storage import DiskFull

    log_records_to_stderr()
    try:
        with refusing():
            config, cfg, files = compose.configure(job, sys.argv[1:])
        if before_work is not None:
            before_work(config)
        work(config, cfg, files)
    except Refused as err:
        _fail(f"error: {err}", REFUSED)
    except Preempted as err:
        _fail(str(err), err.code)
    except DiskFull as err:
        _fail(f"error: {err}", 1)


def train(script: list[str]) -> None:
    """Train with the overrides in ``sys.argv[1:]``; ``script`` re-runs this command (with the same overrides)
    under ``torch.distributed.run`` when more CPU processes were asked for (once the configuration holds)."""
    from gkv_train.training.distributed import relaunch_cpu_processes

    def work(config, cfg, files) -> None:
        from gkv_train.training.launch import run  # trl, transformers, peft: imported once the configuration holds

        run(config, files)

    _job("train", work, before_work=lambda config: relaunch_cpu_processes(script))


def evaluate() -> None:
    """Evaluate with the overrides in ``sys.argv[1:]`` (``gkv_train.evaluation.evaluate.run_evaluation``)."""

    def work(config, cfg, files) -> None:
        from omegaconf import OmegaConf

        from gkv_train.evaluation.evaluate import run_evaluation

        run_evaluation(config, OmegaConf.to_container(cfg, resolve=True), files)

    _job("evaluate", work)


def traces() -> None:
    """Teacher traces with the overrides in ``sys.argv[1:]`` (``gkv_train.evaluation.traces.run_traces``)."""

    def work(config, cfg, files) -> None:
        from gkv_train.evaluation.traces import run_traces

        run_traces(config)  # one output file, no folder: the configuration is not written

    _job("traces", work)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    if argv[0] == "--version":
        print(version_text())
        return
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        sys.exit(f"gkv-train: unknown command {command!r}; choose one of {', '.join(COMMANDS)}\n\n{USAGE}")
    if command == "compare":
        from gkv_train.evidence.command import main as compare

        sys.argv = [f"{sys.argv[0]} compare", *rest]
        compare(rest)
        return
    if command == "check":
        from gkv_train.training.consistency import check

        check(rest)
        return
    if command == "lm-eval":  # lm-evaluation-harness's own command line, the model ``gkv`` registered
        try:
            from gkv_train.evaluation.lm_eval_model import main as lm_eval_main
        except ImportError as err:
            _fail(
                f"error: gkv-train lm-eval needs lm-evaluation-harness: pip install 'gkv-train[lm-eval]' ({err})",
                REFUSED,
            )
        sys.argv = [f"{sys.argv[0]} lm-eval", *rest]
        lm_eval_main()
        return
    if command == "export":
        folders = [word for word in rest if word != "--overwrite"]
        if len(folders) != 2 or len(rest) - len(folders) > 1:
            _fail("usage: gkv-train export RUN_DIR OUT_DIR [--overwrite]", REFUSED)
        from gkv_train.exits import RunLocked
        from gkv_train.export import export

        quiet_upstream_warnings()
        try:
            print(export(*folders, overwrite="--overwrite" in rest))
        except (ValueError, OSError, RunLocked) as err:  # a bad argument, a missing base model, a folder in use
            _fail(f"error: {err}", REFUSED)
        return
    if command == "train":
        import signal

        from gkv_rewards.process import die_with_parent, started_by_launcher

        if (
            started_by_launcher()
        ):  # first of all: a killed launcher (torchrun's agent) stops its workers (with a checkpoint)
            die_with_parent(signum=signal.SIGTERM)
    sys.argv = [f"{sys.argv[0]} {command}", *rest]
    if command == "train":
        train(["-m", "gkv_train.cli", "train"])
    else:
        {"evaluate": evaluate, "traces": traces}[command]()


if __name__ == "__main__":
    main()
