"""The built-in recipes' folder (``RECIPES``), and a recipe of one's own, by path (``recipe=path/to/mine.yaml``,
``--config path/to/mine.yaml``): read and checked (a regular file of YAML keys, bounded, without aliases or Hydra's
settings) and installed where Hydra finds it, on top of the built-in recipe it names (``recipe: rl_full``; without
one, rl_sparse), so that the recipe a run records is the one that ran."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from gkv_train.config.options import RECIPE_ALGORITHMS

RECIPE_BYTES = 1 << 20  # a recipe file's largest size
DEFAULT_RECIPE = "rl_sparse"


def recipes_dir() -> str:
    """The recipes folder, absolute (the same however this is run): ``gkv_train/recipes`` inside an installed wheel,
    the repository's top-level ``recipes/`` in a checkout or an editable install."""
    here = Path(__file__).resolve().parents[1]  # gkv_train
    return str(here / "recipes" if (here / "recipes").is_dir() else here.parent / "recipes")


RECIPES = recipes_dir()


def read_recipe_file(given: str) -> tuple[str, dict]:
    """The text and the keys of the recipe file ``given`` (a path as the user wrote it). ValueError for a file that
    is missing, a folder or not a regular file, too large, not YAML, uses aliases, is not a mapping, or sets Hydra's
    own settings."""
    import yaml

    path = Path(given).expanduser()
    if path.is_dir():
        raise ValueError(f"recipe file {given} is a folder: give a YAML file of keys (learning_rate: 1e-5, ...)")
    if not path.exists():
        raise ValueError(f"recipe file {given} does not exist")
    if not path.is_file():
        raise ValueError(f"recipe file {given} is not a regular file: give a YAML file of keys (learning_rate: 1e-5)")
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
    return text, values


def install_recipe_file(given: str, text: str, values: dict) -> tuple[str, Path]:
    """The recipe file ``given`` (its ``text`` and keys ``values``) as a recipe Hydra composes: the built-in recipe
    it names (its ``recipe`` key; rl_sparse without one) and then its keys, written into
    ``~/.cache/gkv-train/recipes/<its hash>/recipe/<its name>.yaml`` (a relaunch into several processes finds it
    there). Returns (its name, the folder to put on Hydra's search path). ValueError for a ``recipe`` that names no
    built-in recipe."""
    import yaml

    base = values.get("recipe", DEFAULT_RECIPE)
    if base not in RECIPE_ALGORITHMS:
        raise ValueError(
            f"recipe file {given} sets recipe: {base}: a recipe file's recipe names the built-in recipe its keys "
            f"apply on top of ({', '.join(RECIPE_ALGORITHMS)}), or is left out ({DEFAULT_RECIPE})"
        )
    folder = Path.home() / ".cache" / "gkv-train" / "recipes" / hashlib.sha256(text.encode()).hexdigest()[:16]
    (folder / "recipe").mkdir(parents=True, exist_ok=True)
    # its own name, which no built-in recipe has (a built-in of the file's name would be found first)
    name = f"{re.sub(r'[^A-Za-z0-9_]', '_', Path(given).stem)}_{folder.name[:8]}"
    body = yaml.safe_dump({"defaults": [base, "_self_"], **values}, sort_keys=False)
    (folder / "recipe" / f"{name}.yaml").write_text(f"# @package _global_\n# from {given}\n{body}")
    return name, folder
