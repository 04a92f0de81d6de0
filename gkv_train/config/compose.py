"""From the command line to a validated job configuration, in one place: ``configure(job, argv)`` reads a recipe
file of one's own, follows the launcher's precision, checks every key (a moved key named, "did you mean"), composes
the recipes with the overrides (Hydra's compose API) and builds the job's configuration dataclass, which validates
every value; anything wrong is one ``ValueError`` (``Refused`` to the command), before any work."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path

from omegaconf import OmegaConf

from gkv_rollout.config import CompressionConfig, flat_fields
from gkv_train.config.trl_fields import DERIVED


def dotted_keys(mapping: dict, prefix: str = "") -> dict:
    """A nested mapping as {dotted key: value}, the form of the command line's overrides (``{"rl": {"beta": 0}}``
    -> ``{"rl.beta": 0}``; an empty mapping is a value of its own)."""
    found = {}
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            found.update(dotted_keys(value, f"{prefix}{key}."))
        else:
            found[f"{prefix}{key}"] = value
    return found


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


OmegaConf.register_new_resolver("gkv_dir", run_folder, replace=True)


# Keys of earlier versions: key -> where it is now (named in the error that refuses them)
MOVED = {
    # the sampling group, re-keyed under TRL's names (CHANGELOG 2026-12-06)
    **{f"sampling.{key}": key for key in ("num_generations", "temperature", "top_p", "compile_decode")},
    "sampling.max_new_tokens": "max_completion_length",
    "max_new_tokens": "max_completion_length",
    "n_samples": "num_generations",
    "samples_per_prompt": "num_generations",
    # a method's own options, once flat (compression.alpha), then grouped (compression.eviction.alpha,
    # compression.s4r.eta): refused with their new key for one release (0.1.x), then dropped
    **{
        f"compression{group}.{name}": f"compression.options.{name}"
        for group in ("", ".eviction", ".s4r")
        for name, _, _ in flat_fields()
        if name not in {f.name for f in dataclasses.fields(CompressionConfig)}
    },
}


def schema_keys(schema) -> set[str]:
    """Every dotted key of a config dataclass, nested groups included (``compression.budget``, ...)."""
    import typing

    keys = set()
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        keys.add(f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            keys |= {f"{f.name}.{sub}" for sub in schema_keys(hints[f.name])}
    return keys


# Hydra's own command-line flags (everything else with leading dashes is a key=value override written wrongly)
HYDRA_FLAGS = {
    "--help",
    "-h",
    "--hydra-help",
    "--version",
    "--cfg",
    "-c",
    "--resolve",
    "--package",
    "-p",
    "--info",
    "-i",
    "--run",
    "-r",
    "--multirun",
    "-m",
    "--shell-completion",
    "-sc",
    "--config-path",
    "-cp",
    "--config-name",
    "-cn",
    "--config-dir",
    "-cd",
    "--experimental-rerun",
}


def check_overrides(argv: list[str], schema) -> list[str]:
    """Command-line ``key=value`` overrides checked against ``schema`` before Hydra reads them; returns them, with
    ``data.name=null`` added where ``data.path`` (or ``eval_data.path``) is given without a name of its own (the
    built-in task is the default name, and a path and a name together are refused). Raises ValueError for:

    * ``--key=value`` / ``--key value`` (drop the dashes; Hydra's own flags pass);
    * a key of an earlier version (``MOVED``: ``sampling.max_new_tokens`` is ``max_completion_length``), a GRPOConfig
      field this project sets from its own keys (``DERIVED``: ``bf16`` from ``precision``), ``trl.<field>`` (the
      fields are keys of their own), naming the key to write;
    * any other unknown key, with the closest known names ("did you mean").
    A method's option ``compression.options.<name>=value`` (checked by the method when the configuration is built)
    is passed on as ``++compression.options.<name>=value``: Hydra's way to set a key of a mapping the schema does
    not list. Hydra's own syntax (``+key``, ``~key``, ``hydra.*``) is left alone."""
    import difflib

    known = schema_keys(schema)
    options = "compression.options" in known
    known |= {f"compression.options.{name}" for name, _, _ in flat_fields()} if options else set()
    for i, arg in enumerate(argv):
        if arg.startswith("--") and arg.partition("=")[0] not in HYDRA_FLAGS:
            key, eq, value = arg[2:].partition("=")
            if key == "config":  # train.py's recipe file (recipe_files takes it there, before this check)
                raise ValueError(
                    f"{arg}: a recipe file is train.py's (--config file.yaml); here give its keys as key=value"
                )
            value = value if eq else (argv[i + 1] if i + 1 < len(argv) and "=" not in argv[i + 1] else "VALUE")
            raise ValueError(f"{arg}: drop the dashes, overrides are key=value (write {key}={value})")
    named = {arg.partition("=")[0] for arg in argv}
    for group in ("data", "eval_data"):
        if f"{group}.path" in named and f"{group}.name" not in named and f"{group}.path" in known:
            argv = [*argv, f"{group}.name=null"]
    for arg in argv:
        key, eq, value = arg.partition("=")
        if (
            not eq
            or key.startswith(("+", "~", "hydra."))
            or key in known
            or (options and key.startswith("compression.options."))
        ):
            continue
        if key in MOVED and MOVED[key] in known:
            raise ValueError(f"{key} is now {MOVED[key]}: write {MOVED[key]}={value}")
        if key in DERIVED and "prompts_per_step" in known:
            raise ValueError(f"{key} (TRL's) is not a key here: it is set from {DERIVED[key]}")
        if key.startswith("trl.") and key[4:] in known:
            raise ValueError(f"{key}: TRL's fields are keys of their own: write {key[4:]}={value}")
        close = difflib.get_close_matches(key, sorted(known | set(MOVED)), n=3, cutoff=0.6)
        close = list(dict.fromkeys(MOVED.get(name, name) for name in close))  # a moved key by its new name
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise ValueError(f"unknown configuration key {key!r}{hint}")
    return [f"++{arg}" if options and arg.startswith("compression.options.") else arg for arg in argv]


def recipes_dir() -> str:
    """The recipes folder, absolute (the same however this is run): ``gkv_train/recipes`` inside an installed wheel,
    the repository's top-level ``recipes/`` in a checkout or an editable install."""
    here = Path(__file__).resolve().parents[1]  # gkv_train
    return str(here / "recipes" if (here / "recipes").is_dir() else here.parent / "recipes")


RECIPES = recipes_dir()
RECIPE_BYTES = 1 << 20  # a recipe file's largest size
# job -> (its recipe file, its schema's name in the recipes' defaults, the module and class of its configuration)
JOBS = {
    "train": ("train", "train_schema", "gkv_train.config.train_config", "TrainConfig"),
    "evaluate": ("evaluate", "eval_schema", "gkv_train.config.eval_config", "EvalConfig"),
    "traces": ("traces", "traces_schema", "gkv_train.config.eval_config", "TracesConfig"),
}


def job_class(job: str) -> type:
    """The configuration class of ``job`` (train imports TRL; evaluate and traces do not)."""
    import importlib

    _, _, module, name = JOBS[job]
    return getattr(importlib.import_module(module), name)


def configure(job: str, argv: list[str]):
    """``job``'s configuration from its command line ``argv`` (Hydra overrides of the recipes): a recipe file of one's
    own (``recipe_files``, train), the launcher's precision (``precision_from_launcher``, train), the keys
    (``check_overrides``), the composition of recipes and overrides, and the configuration dataclass built from it,
    which checks every value. Returns (configuration, the composed DictConfig, the files that record it: name ->
    text). Raises ValueError naming the first problem."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    config_name, schema_name, _, _ = JOBS[job]
    if job == "train":
        argv = precision_from_launcher(recipe_files(argv))
    cls = job_class(job)
    argv = check_overrides(argv, cls)
    ConfigStore.instance().store(name=schema_name, node=cls)
    try:
        with initialize_config_dir(config_dir=RECIPES, version_base=None):
            cfg = compose(config_name, overrides=argv)
    except (HydraException, OmegaConfBaseException) as err:
        cause = err.__cause__
        detail = f": {str(cause).splitlines()[0]}" if isinstance(cause, OmegaConfBaseException) else ""
        message = " ".join(str(err).split()).split(" Config search path:")[0]  # the search path says nothing here
        raise ValueError(f"{message}{detail}") from None
    try:
        config = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as err:
        raise ValueError(" ".join(str(err).split("\n")[0].split())) from None
    files = {"config.yaml": OmegaConf.to_yaml(cfg, resolve=True), "overrides.yaml": OmegaConf.to_yaml(argv)}
    return config, cfg, files


def precision_from_launcher(overrides: list[str]) -> list[str]:
    """The run's ``precision`` and ``accelerate launch``'s mixed precision (its config file or ``--mixed_precision``,
    which accelerate passes on as ``ACCELERATE_MIXED_PRECISION``; the DeepSpeed recipes say bf16) agree by
    construction: a launch in bf16 whose overrides name no precision trains in bf16 (``precision=bf16`` added,
    said in one line); overrides that contradict the launcher are refused before any work, naming both."""
    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION", "no") or "no"
    if launcher == "no":
        return overrides
    if launcher != "bf16":
        raise ValueError(
            f"accelerate launches with mixed_precision={launcher}; training here is fp32 or bf16: launch "
            "with --mixed_precision bf16 (or no) and set precision=bf16 (or fp32)"
        )
    given = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] == "precision"]
    if not given:
        print("precision=bf16: accelerate launches with mixed_precision=bf16", file=sys.stderr, flush=True)
        return [*overrides, "precision=bf16"]
    if given[-1].partition("=")[2] == "bf16":
        return overrides
    raise ValueError(
        f"{given[-1]}, but accelerate launches with mixed_precision=bf16 (its config file or --mixed_precision): give "
        "precision=bf16, or launch with --mixed_precision no"
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
    if path.stat().st_size > RECIPE_BYTES:
        raise ValueError(f"recipe file {given} has {path.stat().st_size} bytes: a recipe holds at most {RECIPE_BYTES}")
    try:
        text = path.read_text()
        aliases = [e.anchor for e in yaml.parse(text) if isinstance(e, yaml.AliasEvent)]
        values = yaml.safe_load(text)
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ValueError(f"recipe file {given} is not YAML: {' '.join(str(err).split())}") from None
    if aliases:  # each expanded in full by every reader: a few lines can stand for gigabytes, or for themselves
        raise ValueError(f"recipe file {given} uses YAML aliases (*{aliases[0]}): write the values out instead")
    if not isinstance(values, dict):
        raise ValueError(f"recipe file {given} must hold a mapping of keys (learning_rate: 1e-5, ...)")
    if "hydra" in values:
        raise ValueError(
            f"recipe file {given} sets hydra (Hydra's own settings), which a recipe cannot: the run's folder is "
            "output_dir=..."
        )

    try:  # an empty group sets nothing; a method's own options are checked by the method
        keys = [f"{k}=x" for k, v in dotted_keys(values).items() if v != {} and not k.startswith("compression.options")]
        from gkv_train.config.train_config import TrainConfig

        check_overrides(keys, TrainConfig)
    except ValueError as err:
        raise ValueError(f"recipe file {given}: {err}") from None
    folder = Path.home() / ".cache" / "gkv-train" / "recipes" / hashlib.sha256(text.encode()).hexdigest()[:16]
    (folder / "recipe").mkdir(parents=True, exist_ok=True)
    header = "" if text.lstrip().startswith("# @package _global_") else "# @package _global_\n"
    # its own name, which no built-in recipe has (a built-in of the file's name would be found first)
    name = f"{re.sub(r'[^A-Za-z0-9_]', '_', path.stem)}_{folder.name[:8]}"
    (folder / "recipe" / f"{name}.yaml").write_text(header + text)
    return [f"recipe={name}", f"hydra.searchpath=[file://{folder}]", *rest]
