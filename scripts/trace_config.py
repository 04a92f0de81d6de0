"""The path a training configuration takes from the command line to the trainer: ``gkv-train train`` run in-process
under ``sys.setprofile`` until the trainer's first step starts, following the configuration: the calls of project
functions that take it as an argument (the command line's overrides, Hydra's composed configuration, a
configuration dataclass or one of its groups: ``*Config``, ``*Options``, ``*Settings``, ``*Arguments``, a
compression method). One JSON line:

* ``path``: the project modules in the order those calls enter them, consecutive calls in one module as one stop;
* ``stops``, ``modules`` (distinct), ``returns`` (stops in a module already left once);
* ``validating_calls``: the project functions that check the configuration on the way (``check*``, ``validate``,
  a dataclass's ``__post_init__``, ``precision_from_launcher``; in trees before the configuration became TRL's
  arguments also ``_composes`` (a dry-run composition) and ``trainer_args`` (TRL's own checks)), each once.

    python scripts/trace_config.py --tag after --results results/trace_config.json   # this tree, tiny 1-step run
    PYTHONPATH=$OLD:$OLD/rollout:$OLD/rewards python scripts/trace_config.py --root $OLD --tag before \
        --results results/trace_config.json                                        # another tree

``--results`` is the one results file of every traced tree (``{"benchmark": "trace_config", "runs": [...]}``): the
run is added to it (a run of the same tag replaced, the others kept in order); a file that is not one is refused
before the trace.

Only code under ``--root`` counts (the project's packages and scripts; no library), and only until
``transformers.Trainer.train`` is entered.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = [
    "model=tiny",
    "max_steps=1",
    "prompts_per_step=1",
    "num_generations=2",
    "max_completion_length=8",
    "data.limit=4",
    "eval_data.limit=2",
    "overwrite=true",
]
HERE = Path(__file__).resolve().parents[1]  # this checkout
VALIDATING = ("__post_init__", "_composes", "trainer_args", "precision_from_launcher")


class Reached(BaseException):
    """The trainer's first step: tracing ends here."""


def carries_configuration(value) -> bool:
    """Whether a call's argument is (a part of) the configuration."""
    kind = type(value)
    module = getattr(kind, "__module__", None)
    module = module if isinstance(module, str) else ""
    if module.startswith(("gkv_train", "gkv_rollout")) and kind.__name__.endswith(
        ("Config", "Options", "Settings", "Arguments")
    ):
        return True
    if any(base.__name__ == "Method" and base.__module__ == "gkv_rollout.methods" for base in kind.__mro__):
        return True  # a compression method at its settings (one dataclass per method)
    if module.startswith("omegaconf"):
        return True
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) and "=" in v for v in value)


def module_of(path: str, root: Path) -> str | None:
    if "site-packages" in path or path.startswith("<"):  # a library (even in a venv inside the tree), or no file
        return None  # ("<string>": a dataclass's generated __init__; "<frozen abc>"), which would resolve under cwd
    try:
        relative = Path(path).resolve().relative_to(root)
    except ValueError:
        return None
    parts = [p for p in relative.with_suffix("").parts if p not in ("rollout", "rewards")]
    return ".".join(parts)


def trace(root: Path, argv: list[str]) -> dict:
    from gkv_train import cli

    path: list[str] = []
    validations: list[str] = []

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code.co_name == "train" and code.co_filename.endswith("transformers/trainer.py"):
            raise Reached
        module = module_of(code.co_filename, root)
        if module is None or code.co_name == "<module>":
            return
        arguments = [frame.f_locals.get(name) for name in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]]
        if not any(carries_configuration(v) for v in arguments):
            return
        if not path or path[-1] != module:
            path.append(module)
        if code.co_name in VALIDATING or code.co_name.startswith(("check", "validate")):
            owner = type(frame.f_locals["self"]).__name__ + "." if "self" in frame.f_locals else ""
            validations.append(f"{module}.{owner}{code.co_name}")

    sys.setprofile(profile)
    try:
        cli.main(["train", *argv])
    except Reached:
        pass
    finally:
        sys.setprofile(None)
    stops, modules, returns = path_counts(path)
    return {
        "path": path,
        "stops": stops,
        "modules": modules,
        "returns": returns,
        "validating_calls": sorted(set(validations)),
    }


def path_counts(path: list[str], package: str = "") -> tuple[int, int, int]:
    """(stops, distinct modules, returns) of ``path`` restricted to the modules of ``package`` ("" for all),
    consecutive stops in one module counted once."""
    kept: list[str] = []
    for module in path:
        if module.startswith(package) and (not kept or kept[-1] != module):
            kept.append(module)
    seen, returns = set(), 0
    for i, module in enumerate(kept):
        if module in seen and kept[i - 1] != module:
            returns += 1
        seen.add(module)
    return len(kept), len(seen), returns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=HERE, help="the tree traced")
    parser.add_argument("--tag", default="this", help="names the run in the results file and its tables")
    parser.add_argument("--results", type=Path, help="add the run (with command, date, commit) to this results file")
    parser.add_argument("overrides", nargs="*", help="train.py overrides (default: a tiny one-step run)")
    args = parser.parse_args()
    try:
        before = None if args.results is None else read_results(args.results)
    except ValueError as err:
        parser.error(str(err))
    command = "python " + " ".join(sys.argv)  # (the traced command rewrites sys.argv)
    with tempfile.TemporaryDirectory() as out:
        overrides = args.overrides or [*TRAIN, f"output_dir={out}/run"]
        result = trace(args.root.resolve(), overrides)
    commit = subprocess.run(
        ["git", "-C", str(args.root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    record = {
        "benchmark": "trace_config",
        "tag": args.tag,
        "root": os.path.relpath(args.root.resolve(), HERE),  # relative to this checkout: no machine's folder
        "commit": commit,
        "date": time.strftime("%Y-%m-%d"),
        "command": command,
        **result,
    }
    if before is not None:  # through a temporary file (not gkv_train.jsonio: the traced tree may predate it)
        partial = args.results.with_name(f".{args.results.name}.partial")
        partial.write_text(json.dumps(with_run(before, record), indent=1) + "\n")
        partial.replace(args.results)
    print(json.dumps(record))


def read_results(path: Path) -> dict:
    """The results file at ``path``, or an empty one where there is none; anything else is a ValueError naming it.
    (Not ``gkv_train.jsonio.read_results``: this script runs on older trees' packages too.)"""
    if not path.exists():
        return {"benchmark": "trace_config", "runs": []}
    try:
        found = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"--results {path} is not a JSON file ({err})") from None
    if not (
        isinstance(found, dict) and found.get("benchmark") == "trace_config" and isinstance(found.get("runs"), list)
    ):
        raise ValueError(f"--results {path} is not trace_config's results file (benchmark trace_config, its runs)")
    return found


def with_run(result: dict, record: dict) -> dict:
    """``result`` with ``record`` in it: a run of the same tag replaced, the others kept in order."""
    return {**result, "runs": [*(r for r in result["runs"] if r["tag"] != record["tag"]), record]}


def validation_steps(calls: list[str]) -> list[str]:
    """The distinct steps that check the configuration, from its validating functions: the launcher's precision,
    the keys, a dry-run composition, the dataclasses built (their ``__post_init__``), TRL's arguments built."""
    names = {c.rsplit(".", 1)[-1] for c in calls}
    steps = [
        ("precision", "precision_from_launcher"),
        ("keys", "check_overrides"),
        ("dry-run compose", "_composes"),
        ("dataclasses", "__post_init__"),
        ("TRL's arguments", "trainer_args"),
    ]
    return [step for step, name in steps if name in names]


def tables(view: str, result: dict) -> str:
    """``scripts/render_docs.py``'s view ``path`` of the results file (``results/trace_config.json``): each run's
    stops, modules, returns (all, and within ``gkv_train``: the rollout package's stops are its methods checking
    their own settings) and the functions that validate the configuration on the way."""
    if view != "path":
        raise SystemExit(f"error: trace_config has the view path, not {view!r}")
    runs = result["runs"]
    lines = [
        "| run | commit | stops | modules | returns | in gkv_train: stops, modules, returns | validation steps "
        "| validating functions |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        calls = ", ".join(f"`{c}`" for c in run["validating_calls"])
        steps = " + ".join(validation_steps(run["validating_calls"]))
        lines.append(
            f"| {run['tag']} ({run['date']}) | {run['commit']} | {run['stops']} | {run['modules']} | "
            f"{run['returns']} | {', '.join(map(str, path_counts(run['path'], 'gkv_train')))} | {steps} | "
            f"{len(run['validating_calls'])}: {calls} |"
        )
    commands = "; ".join(f"`{run['command']}`" for run in runs)
    return "\n".join(lines) + f"\n\n{commands}\n"


if __name__ == "__main__":
    main()
