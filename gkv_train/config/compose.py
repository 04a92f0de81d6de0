"""From the command line to a validated job configuration, in one place: ``configure(job, argv)`` reads a recipe
file of one's own, follows the launcher's precision, checks every key (a moved key named, "did you mean"), composes
the recipes with the overrides (Hydra's compose API) and builds the job's configuration dataclass, which validates
every value; anything wrong is one ``ValueError`` (``Refused`` to the command), before any work."""

from __future__ import annotations

import dataclasses
from functools import cache

from omegaconf import OmegaConf

from gkv_rollout.config import flat_fields
from gkv_train.config.moved import MOVED, moved_to
from gkv_train.config.options import RECIPE_ALGORITHMS, check_recipe_algorithm
from gkv_train.config.recipe_file import RECIPES
from gkv_train.runs.outputs import run_folder


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


OmegaConf.register_new_resolver("gkv_dir", run_folder, replace=True)


def job_keys(job: str) -> set[str]:
    """Every dotted key of ``job``'s configuration, groups included (``compression``, ``compression.budget``)."""
    found = set()
    for key in dotted_keys(job_defaults(job)):
        parts = key.split(".")
        found |= {".".join(parts[: i + 1]) for i in range(len(parts))}
    return found


# Hydra's command-line flags, which do not apply to a configuration composed with Hydra's compose API (no Hydra job
# runs) -> what to use instead (``--help`` and ``--version`` are the command's own, answered before any check)
HYDRA_FLAGS = {
    **dict.fromkeys(
        ("--cfg", "-c", "--resolve", "--info", "-i", "--package", "-p"),
        "--help lists every key with "
        "its default; the composed configuration is written with the job's output (hydra/config.yaml)",
    ),
    **dict.fromkeys(
        ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd"),
        "a recipe of one's own is --config path/to/recipe.yaml (or recipe=path/to/recipe.yaml)",
    ),
    **dict.fromkeys(("--multirun", "-m"), "one run per command: run it once per setting"),
    **dict.fromkeys(
        ("--hydra-help", "--run", "-r", "--shell-completion", "-sc", "--experimental-rerun"), "--help lists every key"
    ),
}
COMMAND_FLAGS = ("--help", "-h", "--version")  # the command's own (answered by ``cli`` before any check)
# Hydra's own settings a command line may give: recipe folders of one's own (``recipe_files`` adds one)
HYDRA_KEYS = ("hydra.searchpath",)


def check_overrides(argv: list[str], job: str) -> list[str]:
    """Command-line ``key=value`` overrides checked against ``job``'s keys before Hydra reads them; returns them, with
    ``data.name=null`` added where ``data.path`` (or ``eval_data.path``) is given without a name of its own (the
    built-in task is the default name, and a path and a name together are refused). Raises ValueError for:

    * ``--key=value`` / ``--key value`` (drop the dashes);
    * a key of an earlier version (``MOVED``: ``sampling.max_new_tokens`` is ``max_completion_length``), a GRPOConfig
      field this project sets from its own keys (``train_config.DERIVED``: ``bf16`` from ``precision``),
      ``trl.<field>`` (the fields are keys of their own), naming the key to write;
    * a field no run here honours (``upstream.never_honoured``: ``num_train_epochs``, ``do_train``,
      ``resume_from_checkpoint``, ...), naming what to use;
    * ``hydra.*`` but ``hydra.searchpath`` (no Hydra job runs), Hydra's command-line flags, ``recipe=null``;
    * any other unknown key, with the closest known names ("did you mean").
    A method's own option ``compression.<name>=value`` (a registered method's, or any other name: a plug-in's, checked
    by the method when the configuration is built) is passed on as ``++compression.<name>=value``: Hydra's way to set
    a key of a mapping whose defaults do not list it. Hydra's own syntax (``+key``, ``~key``, ``hydra.searchpath``)
    is left alone, but for a moved key."""
    import difflib

    known = job_keys(job)
    derived, unhonoured = job_derived(job), job_unhonoured(job)
    listed = set(known)  # the keys Hydra's defaults hold: a method's own options are not among them

    def own(key: str) -> bool:  # compression.<name> that is no key of the defaults: a method's own option
        return "compression.method" in listed and key.count(".") == 1 and key.startswith("compression.")

    known |= {f"compression.{name}" for name, _, _ in flat_fields()} if "compression.method" in listed else set()
    for i, arg in enumerate(argv):
        flag = arg.partition("=")[0]
        if flag in HYDRA_FLAGS:
            raise ValueError(
                f"{flag}: Hydra's command-line flags do not apply here (the recipes are composed with Hydra's compose "
                f"API, which runs no Hydra job; overrides are key=value): {HYDRA_FLAGS[flag]}"
            )
        if arg.startswith("--") and flag not in COMMAND_FLAGS:
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
        bare = key.lstrip("+~")
        if bare.startswith("hydra.") and not bare.startswith(HYDRA_KEYS):
            raise ValueError(
                f"{bare}: Hydra's job settings do not apply here (the recipes are composed with Hydra's compose API, "
                "which runs no Hydra job): the run's folder is output_dir=... (evaluate.py's too; traces' output=...), "
                "and the composed configuration is written there (hydra/config.yaml)"
            )
        if bare == "recipe" and "recipe" in known and eq and value in ("null", "~", ""):
            raise ValueError(
                f"{arg}: a training run has a recipe ({', '.join(RECIPE_ALGORITHMS)}); without recipe= it is rl_sparse"
            )
        if bare in unhonoured:
            raise ValueError(f"{bare}={value} is not honoured here: {unhonoured[bare]}")
        new = moved_to(bare)
        if new is not None and (new in known or own(new)):
            raise ValueError(f"{bare} is now {new}: write {new}={value}")
        if not eq or key.startswith(("+", "~", "hydra.")) or key in known or own(key):
            continue
        if key in derived:
            raise ValueError(f"{key} (TRL's) is not a key here: it is set from {derived[key]}")
        if key.startswith("trl.") and key[4:] in known:
            raise ValueError(f"{key}: TRL's fields are keys of their own: write {key[4:]}={value}")
        close = difflib.get_close_matches(key, sorted(known | set(MOVED)), n=3, cutoff=0.6)
        close = list(dict.fromkeys(MOVED.get(name, name) for name in close))  # a moved key by its new name
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise ValueError(f"unknown configuration key {key!r}{hint}")
    return [f"++{arg}" if own(arg.partition("=")[0]) and arg.partition("=")[0] not in listed else arg for arg in argv]


# job -> (its recipe file, its defaults' name in the recipes' defaults list)
JOBS = {
    "train": ("train", "train_schema"),
    "evaluate": ("evaluate", "eval_schema"),
    "traces": ("traces", "traces_schema"),
}


def job_classes(job: str) -> dict[str, type]:
    """The configuration classes of ``job``: training's by algorithm (``TRAIN_CONFIGS``: imports TRL), evaluation's
    and traces' one (under their job's name)."""
    if job == "train":
        from gkv_train.config.train_config import TRAIN_CONFIGS

        return TRAIN_CONFIGS
    from gkv_train.config.eval_config import EvalConfig, TracesConfig

    return {job: {"evaluate": EvalConfig, "traces": TracesConfig}[job]}


def job_derived(job: str) -> dict[str, str]:
    """The fields of ``job``'s configuration set from its keys, so not keys themselves: field -> what sets it."""
    if job != "train":
        return {}
    from gkv_train.config.train_config import DERIVED

    return DERIVED


def job_unhonoured(job: str) -> dict[str, str]:
    """The fields of ``job``'s configuration that no run honours (``upstream.never_honoured``): field -> why."""
    if job != "train":
        return {}
    from gkv_train.config.upstream import never_honoured

    return never_honoured()


def class_keys(cls: type, job: str) -> set[str]:
    """The top-level keys of ``job``'s configuration class ``cls``: its fields but private ones, those set from its
    keys (``job_derived``) and those no run honours (``job_unhonoured``)."""
    left_out = {**job_derived(job), **job_unhonoured(job)}
    return {f.name for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_") and f.name not in left_out}


@cache
def job_defaults(job: str) -> dict:
    """Every key of ``job`` at its default, as Hydra holds it (groups as mappings, enums as their values): what
    Hydra composes the recipes and overrides onto (not to be changed in place). Training's are those of every
    algorithm's class (the first's default where they share a key)."""
    found = {}
    for cls in job_classes(job).values():
        fields = [f for f in dataclasses.fields(cls) if f.name not in found and f.name in class_keys(cls, job)]
        found |= field_defaults(fields)
    return found


def field_defaults(fields: list) -> dict:
    """The defaults of dataclass ``fields`` as Hydra holds them: a group's (``options.group``) as the mapping of its
    class's field defaults and the values it is given, without building it; an enum as its value; a field that
    takes a group's other keys (``build``) is none."""
    import enum

    found = {}
    for f in fields:
        if f.metadata.get("other_keys"):  # not a key: the group's keys that are none of its fields (``build``)
            continue
        if "group" in f.metadata:
            kind, given = f.metadata["group"]
            found[f.name] = {**field_defaults(dataclasses.fields(kind)), **given}
            continue
        if f.default is not dataclasses.MISSING:
            value = f.default
        else:
            value = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        found[f.name] = value.value if isinstance(value, enum.Enum) else value
    return found


def build(cls: type, values: dict, prefix: str = ""):
    """The configuration dataclass ``cls`` from a composed mapping ``values`` of its keys, groups (dataclass fields)
    built the same way; each value of a simple type (bool, int, float, str, their ``| None``, lists of them) checked
    first, naming the key (an int is a float where a float is wanted, a number a str where a str is). The class's
    ``__post_init__`` checks the rest. A class with a field marked ``other_keys`` (``CompressionConfig.options``: a
    method's own options) takes there, as a mapping, the keys that are none of its other fields."""
    import typing

    hints = typing.get_type_hints(cls)
    other = next((f.name for f in dataclasses.fields(cls) if f.metadata.get("other_keys")), None)
    unknown = {key: value for key, value in values.items() if key not in hints or key == other}
    if unknown and other is None:
        raise ValueError(f"unknown configuration key {prefix + next(iter(unknown))!r}")
    given = {key: converted(f"{prefix}{key}", hints[key], value) for key, value in values.items() if key not in unknown}
    return cls(**given, **({other: unknown} if other else {}))


def converted(key: str, kind, value):
    """``value`` of the key ``key`` as the type ``kind`` (``build``): a simple type by OmegaConf's rules (a number
    or a bool written as text converted, ``"1e-5"``, ``"yes"``; a bool is no number); ValueError naming the key."""
    import types
    import typing

    from omegaconf import nodes
    from omegaconf.errors import ValidationError

    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if value is None and len(rest) < len(args):
            return None
        return converted(key, rest[0], value) if len(rest) == 1 else value  # several: the class checks
    if dataclasses.is_dataclass(kind):
        if not isinstance(value, dict):
            raise ValueError(f"{key}={value!r}: {key} is a group of keys ({key}.<name>=value)")
        return build(kind, value, f"{key}.")
    if origin is list and len(args) == 1:
        if not isinstance(value, list):
            raise ValueError(f"{key}={value!r}: expected a list ([a, b])")
        return [converted(f"{key}[{i}]", args[0], v) for i, v in enumerate(value)]
    simple = {bool: ("true or false", nodes.BooleanNode), int: ("an integer", nodes.IntegerNode)}
    simple |= {float: ("a number", nodes.FloatNode), str: ("a string", nodes.StringNode)}
    if kind not in simple:
        return value
    wanted, node = simple[kind]
    if value is None:  # (OmegaConf's nodes take None: a field not Optional does not)
        raise ValueError(f"{key}=null: expected {wanted}")
    try:
        return node(value)._value()
    except ValidationError:
        raise ValueError(f"{key}={value!r}: expected {wanted}") from None


def train_class(values: dict) -> type:
    """The class of a training configuration (``values``: its composed keys): its algorithm's. ValueError for an
    unknown algorithm, or for keys another algorithm's class has set away from their defaults (a GRPO option under
    distillation, ``distill.*`` under GRPO)."""
    classes = job_classes("train")
    algorithm = values.get("algorithm")
    if algorithm not in classes:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {tuple(classes)}")
    check_recipe_algorithm(values.get("recipe"), algorithm)  # before its keys: the recipe names the mistake
    own = class_keys(classes[algorithm], "train")
    defaults = dotted_keys(job_defaults("train"))
    foreign = [
        key
        for key, value in dotted_keys(values).items()
        if key.split(".")[0] not in own and defaults.get(key, value) != value
    ]
    if foreign and algorithm == "distill":
        raise ValueError(
            f"{', '.join(foreign)}: GRPO options (TRL's GRPOConfig), but algorithm=distill trains with "
            "transformers' TrainingArguments, which has no such field: drop them or choose a GRPO recipe"
        )
    if foreign:
        raise ValueError(
            f"{', '.join(foreign)}: distillation options, but algorithm={algorithm} does not distil: drop them or "
            "choose a distillation recipe (recipe=distill, distill_onpolicy)"
        )
    return classes[algorithm]


def configure(job: str, argv: list[str]):
    """``job``'s configuration from its command line ``argv`` (Hydra overrides of the recipes): a recipe file of one's
    own (``recipe_files``, train), the launcher's precision (``precision_from_launcher``, train), the keys
    (``check_overrides``), the composition of recipes and overrides onto the job's defaults (a plain mapping), and
    the configuration dataclass built from it (``build``), which checks every value. Returns (configuration, the
    composed DictConfig, the files that record it: name -> text). Raises ValueError naming the first problem."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    config_name, schema_name = JOBS[job]
    if job == "train":
        from gkv_train.config.upstream import precision_from_launcher

        argv = precision_from_launcher(recipe_files(argv))
    argv = check_overrides(argv, job)
    ConfigStore.instance().store(name=schema_name, node=job_defaults(job))
    try:
        with initialize_config_dir(config_dir=RECIPES, version_base=None):
            cfg = compose(config_name, overrides=argv)
        values = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as err:
        cause = err.__cause__
        detail = f": {str(cause).splitlines()[0]}" if isinstance(cause, OmegaConfBaseException) else ""
        message = " ".join(str(err).split()).split(" Config search path:")[0]  # the search path says nothing here
        raise ValueError(f"{message}{detail}") from None
    added = [key for key in values if key not in job_defaults(job)]  # +key=value: Hydra adds any key
    if added:
        derived = job_derived(job)
        set_from = f" (TRL's; set from {derived[added[0]]})" if added[0] in derived else ""
        raise ValueError(f"unknown configuration key {added[0]!r}{set_from}")
    cls = train_class(values) if job == "train" else job_classes(job)[job]
    own = class_keys(cls, job)  # the other algorithm's keys are at their defaults (``train_class``): dropped
    config = build(cls, {key: value for key, value in values.items() if key in own})
    files = {"config.yaml": OmegaConf.to_yaml(cfg, resolve=True), "overrides.yaml": OmegaConf.to_yaml(argv)}
    return config, cfg, files


def recipe_files(argv: list[str]) -> list[str]:
    """A recipe of one's own, by path: ``recipe=path/to/mine.yaml`` or ``--config path/to/mine.yaml`` (as TRL users
    type it) becomes ``recipe=<its name>`` with its copy's folder on Hydra's search path (``recipe_file``: a file of
    top-level keys, ``learning_rate: 1e-5``, ``compression: {method: gkv, budget: 256}``, applied on top of the
    built-in recipe its ``recipe:`` names). Its keys are checked like command-line ones (a moved or TRL-derived key
    named, "did you mean"). ValueError for a file that cannot be read as one, and for a second recipe given beside
    it (another file, or ``recipe=<name>``: one of them would be dropped)."""
    from gkv_train.config.recipe_file import install_recipe_file, read_recipe_file

    given, named, rest, skip = [], [], [], False
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
            given.append(value)
        elif key == "recipe" and (value.endswith((".yaml", ".yml")) or "/" in value):
            given.append(value)
        else:
            named += [value] if key.lstrip("+") == "recipe" and eq else []
            rest.append(arg)
    if not given:
        return argv
    if len(given) > 1:
        raise ValueError(f"two recipe files, {given[0]} and {given[1]}: a run has one recipe; merge their keys")
    if named:
        raise ValueError(
            f"recipe file {given[0]} and recipe={named[0]} both name the run's recipe (one would be dropped): write "
            f"recipe: {named[0]} in the file (its keys then apply on top of {named[0]}), or give one of them"
        )
    text, values = read_recipe_file(given[0])
    try:  # an empty group sets nothing
        keys = [f"{k}=x" for k, v in dotted_keys(values).items() if v != {}]
        check_overrides(keys, "train")
    except ValueError as err:
        raise ValueError(f"recipe file {given[0]}: {err}") from None
    name, folder = install_recipe_file(given[0], text, values)
    return [f"recipe={name}", f"hydra.searchpath=[file://{folder}]", *rest]
