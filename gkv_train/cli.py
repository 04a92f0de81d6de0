"""The ``gkv-train`` command (installed with the package; works from any folder):

    gkv-train train recipe=rl_sparse [key=value ...]      # = accelerate launch train.py ... (see train.py)
    gkv-train evaluate data.name=gsm8k methods=[full,gkv]  # = python scripts/evaluate.py ...
    gkv-train traces data.name=gsm8k output=traces.jsonl   # = python scripts/generate_traces.py ...
    gkv-train check --model tiny --method gkv              # = python scripts/check_consistency.py ...
    gkv-train export RUN_DIR OUT_DIR                       # a run as a self-contained HF folder (LoRA merged)
    gkv-train lm-eval --model gkv --model_args method=gkv,budget=512 --tasks ...   # lm-eval under a compressed cache

``train``, ``evaluate`` and ``traces`` take Hydra overrides of the recipes shipped inside the package
(``gkv_train/recipes`` in the wheel: the repository's ``recipes/``); ``check`` takes ``--options``. Multi-GPU
training runs under ``accelerate launch -m gkv_train.cli train ...``. Each command's work lives in the package
(``gkv_train.launch``, ``gkv_train.evaluation``, ``gkv_train.traces``, ``gkv_train.consistency``); the scripts
in the repository call these same functions.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

from gkv_train.exits import REFUSED


def recipes_dir() -> str:
    """The recipes folder, absolute (the same however this is run): ``gkv_train/recipes`` inside an installed wheel,
    the repository's top-level ``recipes/`` in a checkout or an editable install."""
    here = Path(__file__).resolve().parent
    return str(here / "recipes" if (here / "recipes").is_dir() else here.parent / "recipes")


RECIPES = recipes_dir()
USAGE = "\n\n".join(__doc__.split("\n\n")[:2])
COMMANDS = ("train", "evaluate", "traces", "check", "export", "lm-eval")


SCHEMAS = {"train_schema": "TrainConfig", "eval_schema": "EvalConfig", "traces_schema": "TracesConfig"}


def _schemas(*names: str) -> None:
    """Register the Hydra schemas ``names`` (``train_schema``, ...; none given: all). Only the command's own: the
    training schema is generated from TRL, which evaluation and traces need not import."""
    from hydra.core.config_store import ConfigStore

    from gkv_train import run_config

    store = ConfigStore.instance()
    for name in names or SCHEMAS:
        store.store(name=name, node=getattr(run_config, SCHEMAS[name]))


class ConsoleHandler(logging.StreamHandler):
    """A logging handler that writes to whatever ``sys.stderr`` is when a record comes (so records also reach a
    run's log file once the console is kept there: ``gkv_train.console.log_console_to``); Hydra's job logging
    (``recipes/hydra/job_logging/console.yaml``) uses it, and writes no file of its own."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # logging.StreamHandler sets it; the current sys.stderr is used instead
        pass


def _fail(message: str, code: int) -> NoReturn:
    """End the process with one line on stderr (from the main process of a multi-process run only)."""
    if os.environ.get("RANK", "0") == "0":
        print(message, file=sys.stderr, flush=True)
    sys.exit(code)


def _composes(config_name: str, overrides: list[str]) -> None:
    """Compose ``config_name`` with ``overrides`` as Hydra will (a bad value, type or recipe name fails here), so
    that such an error is one line and exit code 2 like every other check, not Hydra's report."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if any(arg.startswith("-") for arg in overrides):  # Hydra's own flags (--help, --cfg, -m): left to Hydra
        return
    try:
        with initialize_config_dir(config_dir=RECIPES, version_base=None):
            compose(config_name, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        cause = err.__cause__
        detail = f": {str(cause).splitlines()[0]}" if isinstance(cause, OmegaConfBaseException) else ""
        message = " ".join(str(err).split()).split(" Config search path:")[0]  # the search path says nothing here
        _fail(f"error: {message}{detail}", REFUSED)


def quiet_upstream_warnings() -> None:
    """Filter, once per job, the upstream deprecation warnings a user of these commands cannot act on (TRL and
    PEFT call transformers' ``gradient_checkpointing*`` names, which transformers 5.x renamed)."""
    import warnings

    warnings.filterwarnings(
        "ignore", message=r"`(is_)?gradient_checkpointing\w*` is deprecated", category=FutureWarning
    )


def _hydra_job(config_name: str, schema_name: str, work, before_work=None) -> None:
    """Run ``work(config, cfg, config_files)`` on the recipe ``config_name`` with the overrides in ``sys.argv[1:]``:
    keys checked (``run_config.check_overrides``: "did you mean", a moved key named), the configuration validated
    (``schema_name``: the ``gkv_train.run_config`` class) and ``before_work(config)`` run before any work.
    Hydra creates no folder and writes no file (``hydra.run.dir`` is the working folder, no ``output_subdir``):
    ``work`` gets the resolved configuration as ``config_files`` (name -> text) to write once its checks pass.

    A run refused before any work (a bad value, a failed check: ``Refused``) prints one line ``error: ...`` and
    exits with 2; a signal that stops it (``Preempted``) one line and 128 + the signal; a full disk ``error: ...``
    and 1 (``gkv_train.exits``)."""
    from gkv_train import run_config

    if any(a in ("-h", "--help") for a in sys.argv[1:]):  # every key, its type, default and help
        from gkv_train.keyhelp import help_text

        recipes = sorted(p.stem for p in (Path(RECIPES) / "recipe").glob("*.yaml")) if config_name == "train" else None
        print(help_text(getattr(run_config, schema_name), config_name, recipes), end="")
        return

    import hydra
    from omegaconf import DictConfig, OmegaConf

    quiet_upstream_warnings()

    from gkv_train.exits import Preempted, Refused, refusing
    from gkv_train.storage import DiskFull

    _schemas(next(name for name, cls in SCHEMAS.items() if cls == schema_name))

    @hydra.main(version_base=None, config_path=RECIPES, config_name=config_name)
    def main(cfg: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig

        try:
            with refusing():
                config = OmegaConf.to_object(cfg)  # validated: bad values fail here, before any work
            if before_work is not None:
                before_work(config)
            overrides = list(HydraConfig.get().overrides.task)
            files = {
                "config.yaml": OmegaConf.to_yaml(cfg, resolve=True),
                "overrides.yaml": OmegaConf.to_yaml(overrides),
            }
            work(config, cfg, files)
        except Refused as err:
            _fail(f"error: {err}", REFUSED)
        except Preempted as err:
            _fail(str(err), err.code)
        except DiskFull as err:
            _fail(f"error: {err}", 1)

    try:
        run_config.apply_overrides(getattr(run_config, schema_name))
    except ValueError as err:
        _fail(f"error: {err}", REFUSED)
    _composes(config_name, sys.argv[1:])
    main()


def precision_from_launcher(overrides: list[str]) -> list[str]:
    """The run's ``precision`` and ``accelerate launch``'s mixed precision (its config file or ``--mixed_precision``,
    which accelerate passes on as ``ACCELERATE_MIXED_PRECISION``; the DeepSpeed recipes say bf16) agree by
    construction: a launch in bf16 whose overrides name no precision trains in bf16 (``precision=bf16`` added,
    said in one line); overrides that contradict the launcher are refused before any work, naming both."""
    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION", "no") or "no"
    if launcher == "no":
        return overrides
    if launcher != "bf16":
        _fail(
            f"error: accelerate launches with mixed_precision={launcher}; training here is fp32 or bf16: launch "
            "with --mixed_precision bf16 (or no) and set precision=bf16 (or fp32)",
            REFUSED,
        )
    given = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] == "precision"]
    if not given:
        print("precision=bf16: accelerate launches with mixed_precision=bf16", file=sys.stderr, flush=True)
        return [*overrides, "precision=bf16"]
    if given[-1].partition("=")[2] == "bf16":
        return overrides
    _fail(
        f"error: {given[-1]}, but accelerate launches with mixed_precision=bf16 (its config file or "
        "--mixed_precision): give precision=bf16, or launch with --mixed_precision no",
        REFUSED,
    )


def recipe_files(argv: list[str]) -> list[str]:
    """A recipe of one's own, by path: ``recipe=path/to/mine.yaml`` or ``--config path/to/mine.yaml`` (as TRL users
    type it) becomes ``recipe=mine`` with the file's folder on Hydra's search path. The file is a recipe like those
    of ``recipes/recipe/`` (top-level keys: ``learning_rate: 1e-5``, ``compression: {method: gkv, budget: 256}``);
    its keys are checked like command-line ones (a moved or TRL-derived key named, "did you mean"). It is copied,
    with the header that makes its keys top-level, into ``~/.cache/gkv-train/recipes/<its hash>/recipe/`` (a
    relaunch into several processes finds it there). ValueError for a file that is missing or not a mapping."""
    import hashlib

    import yaml

    from gkv_train import run_config

    given, rest, skip = None, [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        key, eq, value = arg.partition("=")
        if key == "--config":
            if not eq:
                if i + 1 >= len(argv):
                    raise ValueError("--config needs a recipe file: --config path/to/recipe.yaml")
                value, skip = argv[i + 1], True
            given = value
        elif key == "recipe" and (value.endswith((".yaml", ".yml")) or "/" in value):
            given = value
        else:
            rest.append(arg)
    if given is None:
        return argv
    path = Path(given).expanduser()
    if not path.is_file():
        raise ValueError(f"recipe file {given} does not exist")
    text = path.read_text()
    try:
        values = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"recipe file {given} is not YAML: {' '.join(str(err).split())}") from None
    if not isinstance(values, dict):
        raise ValueError(f"recipe file {given} must hold a mapping of keys (learning_rate: 1e-5, ...)")

    def flat(node, prefix=""):
        for key, value in node.items():
            if isinstance(value, dict) and f"{prefix}{key}" != "compression.options":
                yield from flat(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}=x"

    try:
        keys = [k for k in flat(values) if not k.startswith("compression.options")]
        run_config.check_overrides(keys, run_config.TrainConfig)
    except ValueError as err:
        raise ValueError(f"recipe file {given}: {err}") from None
    folder = Path.home() / ".cache" / "gkv-train" / "recipes" / hashlib.sha256(text.encode()).hexdigest()[:16]
    (folder / "recipe").mkdir(parents=True, exist_ok=True)
    header = "" if text.lstrip().startswith("# @package _global_") else "# @package _global_\n"
    (folder / "recipe" / f"{path.stem}.yaml").write_text(header + text)
    return [f"recipe={path.stem}", f"hydra.searchpath=[file://{folder}]", *rest]


def train(script: list[str]) -> None:
    """Train with the overrides in ``sys.argv[1:]``; ``script`` re-runs this command (with the same overrides)
    under ``torch.distributed.run`` when more CPU processes were asked for (once the configuration holds)."""
    from gkv_train.distributed import relaunch_cpu_processes

    try:
        sys.argv[1:] = recipe_files(sys.argv[1:])
    except ValueError as err:
        _fail(f"error: {err}", REFUSED)
    sys.argv[1:] = precision_from_launcher(sys.argv[1:])

    def work(config, cfg, files) -> None:
        from gkv_train.launch import run  # trl, transformers, peft: imported once the configuration holds

        run(config, files)

    _hydra_job("train", "TrainConfig", work, before_work=lambda config: relaunch_cpu_processes(script))


def evaluate() -> None:
    """Evaluate with the overrides in ``sys.argv[1:]`` (``gkv_train.evaluation.run_evaluation``)."""

    def work(config, cfg, files) -> None:
        from omegaconf import OmegaConf

        from gkv_train.evaluation import run_evaluation

        run_evaluation(config, OmegaConf.to_container(cfg, resolve=True), files)

    _hydra_job("evaluate", "EvalConfig", work)


def traces() -> None:
    """Teacher traces with the overrides in ``sys.argv[1:]`` (``gkv_train.traces.run_traces``)."""

    def work(config, cfg, files) -> None:
        from gkv_train.traces import run_traces

        run_traces(config)  # one output file, no folder: the configuration is not written

    _hydra_job("traces", "TracesConfig", work)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    if argv[0] == "--version":
        from importlib.metadata import version

        parts = ", ".join(f"{name} {version(name)}" for name in ("gkv-rollout", "gkv-rewards"))
        print(f"gkv-train {version('gkv-train')} ({parts})")
        return
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        sys.exit(f"gkv-train: unknown command {command!r}; choose one of {', '.join(COMMANDS)}\n\n{USAGE}")
    if command == "check":
        from gkv_train.consistency import check

        check(rest)
        return
    if command == "lm-eval":  # lm-evaluation-harness's own command line, the model ``gkv`` registered
        try:
            from gkv_train.lm_eval_model import main as lm_eval_main
        except ImportError as err:
            _fail(
                f"error: gkv-train lm-eval needs lm-evaluation-harness: pip install 'gkv-train[lm-eval]' ({err})",
                REFUSED,
            )
        sys.argv = [f"{sys.argv[0]} lm-eval", *rest]
        lm_eval_main()
        return
    if command == "export":
        if len(rest) != 2:
            _fail("usage: gkv-train export RUN_DIR OUT_DIR", REFUSED)
        from gkv_train.export import export

        quiet_upstream_warnings()
        try:
            print(export(*rest))
        except ValueError as err:
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
