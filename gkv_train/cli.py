"""The ``gkv-train`` command (installed with the package; works from any folder):

    gkv-train train recipe=rl_sparse [key=value ...]      # = accelerate launch train.py ... (see train.py)
    gkv-train evaluate data.name=gsm8k methods=[full,gkv]  # = python scripts/evaluate.py ...
    gkv-train traces data.name=gsm8k output=traces.jsonl   # = python scripts/generate_traces.py ...
    gkv-train check --model tiny --method gkv              # = python scripts/check_consistency.py ...

``train``, ``evaluate`` and ``traces`` take Hydra overrides of the recipes shipped inside the package
(``gkv_train/recipes``: the repository's ``recipes/``); ``check`` takes ``--options``. Multi-GPU training runs
under ``accelerate launch -m gkv_train.cli train ...``. Each command's work lives in the package
(``gkv_train.launch``, ``gkv_train.evaluation``, ``gkv_train.traces``, ``gkv_train.consistency``); the scripts
in the repository call these same functions.
"""

from __future__ import annotations

import sys
from pathlib import Path

RECIPES = str(Path(__file__).resolve().parent / "recipes")  # absolute: the same folder however this is run
USAGE = "\n\n".join(__doc__.split("\n\n")[:2])
COMMANDS = ("train", "evaluate", "traces", "check")


def _schemas() -> None:
    from hydra.core.config_store import ConfigStore

    from gkv_train.run_config import EvalConfig, TracesConfig, TrainConfig

    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    store.store(name="eval_schema", node=EvalConfig)
    store.store(name="traces_schema", node=TracesConfig)


def _hydra_job(config_name: str, schema_name: str, passthrough: bool, work, before_run=None) -> None:
    """Run ``work(config, cfg)`` on the recipe ``config_name`` with the overrides in ``sys.argv[1:]``: TRL's
    names and aliases translated, "did you mean" on a misspelled key, the configuration validated before any
    work (``schema_name``: the ``gkv_train.run_config`` class); ``before_run`` runs after the translation."""
    import hydra
    from omegaconf import DictConfig, OmegaConf

    from gkv_train import run_config

    _schemas()

    @hydra.main(version_base=None, config_path=RECIPES, config_name=config_name)
    def main(cfg: DictConfig) -> None:
        work(OmegaConf.to_object(cfg), cfg)  # validated: bad values fail here, before any work

    run_config.apply_overrides(getattr(run_config, schema_name), passthrough=passthrough)
    if before_run is not None:
        before_run()
    main()


def train(script: list[str]) -> None:
    """Train with the overrides in ``sys.argv[1:]``; ``script`` re-runs this command (with the same overrides)
    under ``torch.distributed.run`` when more CPU processes were asked for."""
    from gkv_train.distributed import relaunch_cpu_processes

    def work(config, cfg) -> None:
        from gkv_train.launch import run  # trl, transformers, peft: imported once the configuration holds

        run(config)

    _hydra_job("train", "TrainConfig", True, work, before_run=lambda: relaunch_cpu_processes(script))


def evaluate() -> None:
    """Evaluate with the overrides in ``sys.argv[1:]`` (``gkv_train.evaluation.run_evaluation``)."""

    def work(config, cfg) -> None:
        from omegaconf import OmegaConf

        from gkv_train.evaluation import run_evaluation

        run_evaluation(config, OmegaConf.to_container(cfg, resolve=True))

    _hydra_job("evaluate", "EvalConfig", False, work)


def traces() -> None:
    """Teacher traces with the overrides in ``sys.argv[1:]`` (``gkv_train.traces.run_traces``)."""

    def work(config, cfg) -> None:
        from gkv_train.traces import run_traces

        run_traces(config)

    _hydra_job("traces", "TracesConfig", False, work)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        sys.exit(f"gkv-train: unknown command {command!r}; choose one of {', '.join(COMMANDS)}\n\n{USAGE}")
    if command == "check":
        from gkv_train.consistency import check

        check(rest)
        return
    if command == "train":
        from gkv_train.process import die_with_parent, launched_by_agent

        if launched_by_agent():  # first of all: a killed launcher / agent takes its workers along
            die_with_parent()
    sys.argv = [f"{sys.argv[0]} {command}", *rest]
    if command == "train":
        train(["-m", "gkv_train.cli", "train"])
    else:
        {"evaluate": evaluate, "traces": traces}[command]()


if __name__ == "__main__":
    main()
