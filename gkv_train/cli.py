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


def train(script: list[str]) -> None:
    """Train with the overrides in ``sys.argv[1:]``; ``script`` re-runs this command (with the same overrides)
    under ``torch.distributed.run`` when more CPU processes were asked for."""
    import hydra
    from omegaconf import DictConfig, OmegaConf

    from gkv_train.distributed import relaunch_cpu_processes
    from gkv_train.run_config import TrainConfig, apply_overrides

    _schemas()

    @hydra.main(version_base=None, config_path=RECIPES, config_name="train")
    def main(cfg: DictConfig) -> None:
        config: TrainConfig = OmegaConf.to_object(cfg)  # validated: bad values fail here, before any work
        from gkv_train.launch import run  # trl, transformers, peft: imported once the configuration holds

        run(config)

    apply_overrides(TrainConfig, passthrough=True)  # TRL's names, "did you mean"
    relaunch_cpu_processes(script)
    main()


def evaluate() -> None:
    """Evaluate with the overrides in ``sys.argv[1:]`` (``gkv_train.evaluation.run_evaluation``)."""
    import hydra
    from omegaconf import DictConfig, OmegaConf

    from gkv_train.run_config import EvalConfig, apply_overrides

    _schemas()

    @hydra.main(version_base=None, config_path=RECIPES, config_name="evaluate")
    def main(cfg: DictConfig) -> None:
        config: EvalConfig = OmegaConf.to_object(cfg)  # validated before any work
        from gkv_train.evaluation import run_evaluation

        run_evaluation(config, OmegaConf.to_container(cfg, resolve=True))

    apply_overrides(EvalConfig, passthrough=False)  # aliases (n_samples), "did you mean"
    main()


def traces() -> None:
    """Teacher traces with the overrides in ``sys.argv[1:]`` (``gkv_train.traces.run_traces``)."""
    import hydra
    from omegaconf import DictConfig, OmegaConf

    from gkv_train.run_config import TracesConfig, apply_overrides

    _schemas()

    @hydra.main(version_base=None, config_path=RECIPES, config_name="traces")
    def main(cfg: DictConfig) -> None:
        config: TracesConfig = OmegaConf.to_object(cfg)  # validated before any work
        from gkv_train.traces import run_traces

        run_traces(config)

    apply_overrides(TracesConfig, passthrough=False)  # aliases (n_samples, samples_per_prompt), "did you mean"
    main()


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
