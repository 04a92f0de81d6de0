"""The results file as ``gkv-train compare``'s memory: its training section checked against this call's settings
(made with others: an error before any work), what each recipe's name stands for (its composed ``train``
configuration), which jobs it already holds, and the learning-rate sweep and the rate every recipe trains with."""

from __future__ import annotations

import json
from pathlib import Path

from gkv_train.config.compose import dotted_keys
from gkv_train.config.moved import EARLIER, current_keys
from gkv_train.evidence.design import RUN_KEYS, lr_name, run_name, settings
from gkv_train.evidence.runs import train_keys

IDENTITY_FREE = (
    ("train", "seeds"),
    ("train", "distill_seeds"),
    ("train", "variants"),
    ("train", "resolved"),  # checked per recipe: check_resolved
    ("eval", "budgets"),
    ("eval", "fresh_seeds"),
)


def run_identity(found: dict) -> dict:
    """``settings`` without what may grow between calls (seeds, variants, budgets): two calls whose identities
    are equal produce the same cell for the same run."""
    found = json.loads(json.dumps(found))
    for section, key in IDENTITY_FREE:
        found[section].pop(key, None)
    return found


def file_stamp(path: Path) -> tuple | None:
    """What changes when ``path`` is replaced or written: (inode, size, mtime in ns); None when it does not exist."""
    if not path.is_file():
        return None
    found = path.stat()
    return found.st_ino, found.st_size, found.st_mtime_ns


def published(args) -> dict:
    """The results file's training section, checked against this call's settings: {} when there is none; an error
    naming what differs when it was made with other settings (its cells would be mixed with this call's) or
    defines a variant otherwise. Read once per change of the file."""
    path = args.results
    stamp = file_stamp(path)
    cache = getattr(args, "_published", None)
    if cache is not None and cache[0] == stamp:
        return cache[1]
    section = json.loads(path.read_text()).get("training", {}) if stamp is not None else {}
    if section:
        mine, theirs = dotted_keys(run_identity(settings(args))), dotted_keys(run_identity(section["settings"]))
        # a key the file lacks was not recorded by the version that wrote it: not held against it
        differ = sorted(k for k in set(mine) | set(theirs) if k in theirs and mine.get(k) != theirs.get(k))
        if differ:
            raise SystemExit(
                f"error: {path} holds a training section made with other settings ({', '.join(differ)}): "
                "another --results, or the same settings"
            )
        ours, defined = args.variants, section["settings"]["train"].get("variants", {})
        clash = [n for n in ours if n in defined and [defined[n]["recipe"], defined[n]["overrides"]] != list(ours[n])]
        if clash:
            raise SystemExit(f"error: {path} defines --variant {', '.join(clash)} otherwise: another name")
    args._published = (stamp, section)
    return section


def resolved(args, recipes: list[str] | None = None) -> dict:
    """recipe (of ``recipes``, default ``--recipes``) -> the ``train.py`` configuration it stands for, as
    ``train.py`` composes it (dotted keys, every default filled in), without ``RUN_KEYS``: what a recipe's name
    means in the results, so that runs of one name made under another default are not pooled. Composed once per
    call (imports TRL: seconds)."""
    if getattr(args, "_resolved", None) is None:
        import yaml

        from gkv_train.config.compose import configure

        args._resolved = {}
        for recipe in args.recipes if recipes is None else recipes:
            _, _, files = configure("train", train_keys(recipe, args.lr_seed, 1e-4, args, make_traces=False))
            found = dotted_keys(yaml.safe_load(files["config.yaml"]))
            args._resolved[recipe] = {k: v for k, v in found.items() if k not in RUN_KEYS}
    return args._resolved


def meaning(keys: dict) -> dict:
    """A composed training configuration's dotted ``keys`` as what they mean for a run: the ``compression.*`` keys
    as the method they build (``CompressionConfig.identity``: a shared option left to the method, None, equals the
    method's own value an earlier version wrote out, ``pool: max``), without the fields no run honours
    (``upstream.never_honoured``: ``do_eval``, ...)."""
    from gkv_rollout.config import CompressionConfig
    from gkv_train.config.upstream import never_honoured

    unread = never_honoured()
    found = {k: v for k, v in keys.items() if k not in unread and not k.startswith("compression.")}
    given = {k.split(".", 1)[1]: v for k, v in keys.items() if k.startswith("compression.") and v is not None}
    if "method" not in given:
        return {**found, **{f"compression.{k}": v for k, v in given.items()}}
    try:
        built = CompressionConfig.template(given.pop("method"), **given).identity()
    except ValueError:  # what an earlier version took and today's refuses: compared as written
        return {**found, **{f"compression.{k}": v for k, v in keys.items() if k.startswith("compression.")}}
    return {**found, **{f"compression.{k}": v for k, v in built.items()}}


def check_resolved(args) -> None:
    """An error naming the keys when a recipe of this call composes to another configuration than the published
    runs of that name were trained with (a default changed since, or an override): they would be pooled as one.
    Compared by ``meaning``; a key the published record lacks (added since) is held against it only where an
    earlier version ran otherwise than today's default (``moved.EARLIER``: ``chunk_given``, token by token)."""
    before = published(args).get("settings", {}).get("train", {}).get("resolved", {})
    for recipe, mine in resolved(args).items():
        theirs = before.get(recipe)
        if theirs is None:
            continue
        mine, theirs = meaning(mine), meaning({**EARLIER, **current_keys(theirs)})
        differ = sorted(k for k in set(mine) | set(theirs) if k in theirs and mine.get(k) != theirs[k])
        if differ:
            shown = ", ".join(f"{k}: {theirs.get(k)!r} there, {mine.get(k)!r} here" for k in differ[:6])
            raise SystemExit(
                f"error: {args.results}: recipe {recipe} now composes to other train.py settings than its published "
                f"runs were trained with ({shown}): another --results, or --train-keys that set them back"
            )


def published_done(args) -> set[str]:
    """Keys of the jobs the results file holds: an lr-stage evaluation (and its training run, if its adapter is
    kept under ``--adapters``), a training run whose adapter is kept, the evaluation cells of the untrained model and
    of such runs (a run without its adapter is trained again, and its old cells are not counted)."""
    section = published(args)

    def kept(name: str) -> bool:
        return (args.adapters / name / "adapter_model.safetensors").is_file()

    found = set()
    for lr in args.lrs:
        if section.get("lr_sweep", {}).get(lr_name(lr)) is not None:
            found.add(f"lr-eval/{lr_name(lr)}")
            if kept(run_name(args.lr_recipe, args.lr_seed, lr)):
                found.add(f"train/{run_name(args.lr_recipe, args.lr_seed, lr)}")
    for name, model in section.get("models", {}).items():
        if name != "untrained" and not kept(name):
            continue  # trained again here: its old cells are not this run's
        if name != "untrained":
            found.add(f"train/{name}")
        found |= {f"eval/{name}@{c}" for c, cell in model.get("cells", {}).items() if cell is not None}
    for name, model in section.get("cross", {}).get("models", {}).items():
        found |= {f"cross/{name}@{c}" for c, cell in model["cells"].items() if cell is not None}
    return found


def chosen_lr(args) -> float | None:
    """The learning rate every recipe trains with: ``--lr``, or the ``lr`` stage's choice once every candidate is
    evaluated (None before)."""
    if args.lr is not None:
        return args.lr
    sweep = lr_sweep(args)
    if any(r is None for r in sweep.values()):
        return None
    return max(args.lrs, key=lambda lr: (sweep[lr_name(lr)]["pass@1"], sweep[lr_name(lr)]["score"], -lr))


def lr_sweep(args) -> dict:
    """lr -> the lr stage's evaluation of its model (None until done)."""
    found, before = {}, published(args).get("lr_sweep", {})
    for lr in args.lrs:
        summary = args.output_root / "lr-eval" / lr_name(lr) / "summary.json"
        runs = {r["run"]: r for r in json.loads(summary.read_text())["runs"]} if summary.is_file() else {}
        cell = runs.get(f"gkv-b{args.train_budget}")
        found[lr_name(lr)] = (
            before.get(lr_name(lr))
            if cell is None
            else {
                "pass@1": cell["pass@1"],
                "pass@1_ci95": cell["pass@1_ci95"],
                "score": cell["score"],
                "mean_completion_length": cell["mean_completion_length"],
            }
        )
    return found
