"""``gkv-train compare``'s tables (the views ``scripts/render_docs.py`` writes into the docs) and its figure of the
training curves."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from gkv_train.evidence.design import RECIPES, lr_name
from gkv_train.evidence.methods_stage import ordering_table
from gkv_train.provenance import provenance


def cell(figures: dict) -> str:
    lo, hi = figures["pass@1_ci95"]
    return f"{figures['pass@1']:.3f} [{lo:.2f}, {hi:.2f}]"


def training_table(section: dict) -> str:
    """Per recipe: pass@1 over seeds [hierarchical 95% interval] under each condition, per-seed values at the
    training budget, RL-Sparse minus it (paired, with its interval), mean length, per seed the share at the length
    limit and the pass@1 of the completions that stopped before it, and decode rounds."""
    table = section.get("recipes") or {}
    if not table:
        return "(no model evaluated yet)\n"
    conditions_ = list(table)
    train = f"gkv-b{section['settings']['train']['budget']}"
    lines = [
        "| recipe | seeds | " + " | ".join(conditions_) + f" | per seed ({train}) | RL-Sparse minus it ({train}) | "
        f"RL-Sparse minus it (full) | length ({train}) | at the limit, per seed ({train}) | "
        f"pass@1 of those that stopped, per seed ({train}) | rounds ({train}) |",
        "|---|---|" + "---|" * (len(conditions_) + 7),
    ]
    names = list(dict.fromkeys(n for c in conditions_ for n in table[c]))
    for name in names:
        at = table.get(train, {}).get(name)
        cells = [cell(table[c][name]) if name in table[c] else "-" for c in conditions_]

        def diff(condition: str) -> str:
            d = table.get(condition, {}).get(name, {}).get("rl_sparse_minus")
            if not d:
                return "-"
            lo, hi = d["ci95"]
            mark = " *" if lo > 0 or hi < 0 else ""
            return f"{d['difference']:+.3f} [{lo:+.2f}, {hi:+.2f}]{mark}"

        per_seed = ", ".join(f"{v:.2f}" for v in at["per_seed"]) if at else "-"
        limited = ", ".join(f"{v:.2f}" for v in at["at_limit_per_seed"]) if at else "-"
        stopped = ", ".join("-" if v is None else f"{v:.2f}" for v in at["pass@1_stopped_per_seed"]) if at else "-"
        lines.append(
            f"| {name} | {max((table[c][name]['seeds'] for c in conditions_ if name in table[c]), default=0)} | "
            + " | ".join(cells)
            + f" | {per_seed} | {diff(train)} | {diff('full')} | "
            + (
                f"{at['mean_length']:.0f} | {limited} | {stopped} | {at['mean_rounds']:.1f} |"
                if at
                else "- | - | - | - |"
            )
        )
    return "\n".join(lines) + "\n"


def writing_table(section: dict) -> str:
    """``count_recall``: per condition and model, the share of completions that restate the note's code before
    their count ends [95% interval over seeds and problems], how far the count had got when they first did
    (median share of it), mean length and the share at the length limit (per seed)."""
    rows = [
        (condition, name, f)
        for condition, by in (section.get("recipes") or {}).items()
        for name, f in by.items()
        if "restated" in f
    ]
    if not rows:
        return "(no count_recall model evaluated yet)\n"
    lines = [
        "| condition | model | seeds | code restated before the count's end | per seed | counted by then (median) | "
        "length | at the limit, per seed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for condition, name, f in rows:
        lo, hi = f["restated_ci95"]
        at = "-" if f["restated_at_median"] is None else f"{f['restated_at_median']:.2f}"
        lines.append(
            f"| {condition} | {name} | {f['seeds']} | {f['restated']:.3f} [{lo:.2f}, {hi:.2f}] | "
            f"{', '.join(f'{v:.2f}' for v in f['restated_per_seed'])} | {at} | {f['mean_length']:.0f} | "
            f"{', '.join(f'{v:.2f}' for v in f['at_limit_per_seed'])} |"
        )
    return "\n".join(lines) + "\n"


def rounds_table(section: dict) -> str:
    """pass@1 by decode-time compression rounds per completion at the training budget (samples in brackets)."""
    train = f"gkv-b{section['settings']['train']['budget']}"
    rows = (section.get("recipes") or {}).get(train, {})
    if not rows:
        return "(no model evaluated yet)\n"
    bins = [b["rounds"] for b in next(iter(rows.values()))["by_rounds"]]
    heads = [(f"{lo}-{hi - 1}" if hi - 1 > lo else f"{lo}") if hi is not None else f">= {lo}" for lo, hi in bins]
    lines = ["| recipe | " + " | ".join(f"rounds {h}" for h in heads) + " |", "|---|" + "---|" * len(heads)]
    for name, r in rows.items():
        lines.append(
            f"| {name} | "
            + " | ".join("-" if b["pass@1"] is None else f"{b['pass@1']:.2f} ({b['samples']})" for b in r["by_rounds"])
            + " |"
        )
    return "\n".join(lines) + "\n"


DRIFT = (
    ("completions/mean_length", "length", "{:.0f}"),
    ("completions/clipped_ratio", "at the limit", "{:.2f}"),
    ("reward", "reward", "{:.2f}"),
    ("entropy", "entropy", "{:.2f}"),
)


def drift_table(section: dict) -> str:
    """Per training run, how its own rollouts changed: the mean over the first quarter of the steps -> over the
    last quarter, of the completions' length, the share cut at the length limit, the reward and the entropy."""
    runs = [m for m in section.get("models", {}).values() if m.get("curve")]
    if not runs:
        return "(no run trained yet)\n"
    lines = ["| run | " + " | ".join(f"{head}, first -> last quarter" for _, head, _ in DRIFT) + " |"]
    lines.append("|---|" + "---|" * len(DRIFT))
    for model in sorted(runs, key=lambda m: (m["recipe"], m["seed"])):
        cells = []
        for key, _, form in DRIFT:
            values = [v for _, v in model["curve"].get(key, []) if v is not None]  # NaN is stored as null
            if not values:
                cells.append("-")
                continue
            quarter = max(1, len(values) // 4)
            first, last = sum(values[:quarter]) / quarter, sum(values[-quarter:]) / quarter
            cells.append(f"{form.format(first)} -> {form.format(last)}")
        lines.append(f"| {model['recipe']} seed {model['seed']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def cost_table(section: dict) -> str:
    """Per recipe, the seconds of one training step from the runs' own metrics: the median over every step of every
    run, each run's own median, and the rollout's part (``rollout/seconds``: sampling and scoring the
    completions, and for Sparse-RL's rejection the trainer's no-grad log-probs of them; the rest: the trainer's
    log-probs, loss and backward)."""
    runs: dict[str, list[dict]] = {}
    for model in section.get("models", {}).values():
        if model.get("curve", {}).get("step_time"):
            runs.setdefault(model["recipe"], []).append(model["curve"])
    if not runs:
        return "(no step timed yet)\n"
    lines = [
        "| recipe | runs | steps | seconds per step (median) | runs' medians | rollout (median) | the rest (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    for recipe, curves in runs.items():
        step_seconds = [v for c in curves for _, v in c["step_time"]]
        rollout = {(i, s): v for i, c in enumerate(curves) for s, v in c.get("rollout/seconds", [])}
        rest = [v - rollout[(i, s)] for i, c in enumerate(curves) for s, v in c["step_time"] if (i, s) in rollout]
        medians = sorted(statistics.median(v for _, v in c["step_time"]) for c in curves)
        lines.append(
            f"| {recipe} | {len(curves)} | {len(step_seconds)} | {statistics.median(step_seconds):.0f} | "
            f"{', '.join(f'{m:.0f}' for m in medians)} | "
            + (f"{statistics.median(rollout.values()):.0f} | {statistics.median(rest):.0f} |" if rest else "- | - |")
        )
    return "\n".join(lines) + "\n"


def differences_table(section: dict) -> str:
    """Every difference (recipe minus recipe, per condition): paired by seed, over the seeds both have, with its 95%
    interval, then over every seed of each with each recipe's seeds resampled on their own (``ci95_seeds_independent``;
    its estimate differs where one recipe has seeds the other lacks); * where an interval excludes 0; the seeds each
    stands on in brackets."""
    found = section.get("differences") or {}
    if not any(found.values()):
        return "(no paired difference yet)\n"
    conditions_ = list(found)
    pairs = list(dict.fromkeys(p for c in conditions_ for p in found[c]))
    lines = [
        "| difference (paired by seed / seeds on their own) | " + " | ".join(conditions_) + " |",
        "|---|" + "---|" * len(conditions_),
    ]
    for pair in pairs:
        cells = []
        for condition in conditions_:
            d = found[condition].get(pair)
            if not d:
                cells.append("-")
                continue
            lo, hi = d["ci95"]
            text = f"{d['difference']:+.3f} [{lo:+.2f}, {hi:+.2f}]{' *' if lo > 0 or hi < 0 else ''} ({d['seeds']})"
            if "difference_seeds_independent" in d:
                (ilo, ihi), (n, m) = d["ci95_seeds_independent"], d["seeds_independent"]
                mark = " *" if ilo > 0 or ihi < 0 else ""
                text += f" / {d['difference_seeds_independent']:+.3f} [{ilo:+.2f}, {ihi:+.2f}]{mark} ({n} and {m})"
            cells.append(text)
        lines.append(f"| {pair.replace(' - ', ' minus ')} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


JUDGED = {  # issue 53's pre-registered comparisons per task: (difference, condition, judged or only reported)
    "copy_recall": [
        ("rl_sparse_noclip - rl_full_noclip", "gkv-b160-seed2", True),
        ("rl_sparse_noclip - rl_full_noclip", "gkv-b160", False),
    ],
    "long_recall": [
        ("rl_sparse_noclip - sparse_rl_noclip", "gkv-b128", True),
        ("rl_sparse_noclip - rl_full_noclip", "gkv-b128", True),
    ],
}


SHOWN = {"rl_sparse": "RL-Sparse", "sparse_rl": "Sparse-RL", "rl_full": "RL-Full"}  # the names the docs use


def judged_table(section: dict) -> str:
    """The task's pre-registered comparisons (``JUDGED``): each recipe's seeds, the estimate over every seed of
    each and its interval with each recipe's seeds resampled on their own (the judged one), the seed-paired
    estimate and interval over the seeds both have, and the reading the plan fixed in advance (with how many of the
    planned seeds it stands on while some are missing)."""
    variants = section["settings"]["train"].get("variants", {})

    def shown(name: str) -> str:
        return SHOWN.get(variants.get(name, {}).get("recipe", name), name)

    lines = [
        "| difference | condition | seeds | estimate | seeds on their own (judged) | seed s with seed s | reading |",
        "|---|---|---|---|---|---|---|",
    ]
    for pair, condition, judged in JUDGED.get(section["settings"].get("task", {}).get("name", "copy_recall"), []):
        mine, other = (shown(n) for n in pair.split(" - "))
        d = (section.get("differences") or {}).get(condition, {}).get(pair)
        if not d or "difference_seeds_independent" not in d:  # none yet, or published by a version without it
            lines.append(f"| {mine} minus {other} | {condition} | - | - | - | - | - |")
            continue
        (lo, hi), (plo, phi), (n, m) = d["ci95_seeds_independent"], d["ci95"], d["seeds_independent"]
        reading = f"{mine} better" if lo > 0 else f"{other} better" if hi < 0 else "not separated"
        reading += " (judged)" if judged else " (reported)"
        planned = len(section["settings"]["train"].get("seeds", []))
        if min(n, m) < planned:  # not a judgment yet
            reading += f", so far: {min(n, m)} of {planned} seeds"
        lines.append(
            f"| {mine} minus {other} | {condition} | {n} and {m} | {d['difference_seeds_independent']:+.3f} | "
            f"[{lo:+.3f}, {hi:+.3f}] | {d['difference']:+.3f} [{plo:+.3f}, {phi:+.3f}] over {d['seeds']} | "
            f"{reading} |"
        )
    return "\n".join(lines) + "\n"


def cross_table(section: dict) -> str:
    """The models of ``--cross-adapters`` on this task (the other task's, or this task's own under the training-free
    rules of ``--eval-controls``): this task's untrained model, then per recipe pass@1 over seeds under each
    condition, and its paired difference against the untrained model (* where the interval excludes 0)."""
    cross = section.get("cross") or {}
    table = cross.get("recipes") or {}
    if not table:
        return "(no model of the other task evaluated yet)\n"
    conditions_ = list(table)
    lines = [
        "| model (recipe, of --cross-adapters) | seeds | "
        + " | ".join(f"{c} | minus untrained ({c})" for c in conditions_)
        + " |",
        "|---|---|" + "---|---|" * len(conditions_),
    ]
    for recipe in dict.fromkeys(r for c in conditions_ for r in table[c]):
        cells = []
        for c in conditions_:
            row = table[c].get(recipe)
            d = (row or {}).get("minus_untrained")
            lo, hi = d["ci95"] if d else (0, 0)
            mark = " *" if d and (lo > 0 or hi < 0) else ""
            cells += [cell(row) if row else "-", f"{d['difference']:+.3f} [{lo:+.2f}, {hi:+.2f}]{mark}" if d else "-"]
        seeds = max(table[c][recipe]["seeds"] for c in conditions_ if recipe in table[c])
        lines.append(f"| {recipe} | {seeds} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\nModels from `{cross.get('adapters')}`.\n"


def gap_closed(rule: float, compressed: float, full: float) -> str:
    """The share of the compressed gap a rule closes: (rule - compressed) / (full - compressed); "-" without a gap."""
    return "-" if full <= compressed else f"{(rule - compressed) / (full - compressed):.2f}"


def controls_table(section: dict) -> str:
    """The training-free rules (``--eval-controls``, the cross stage's conditions besides the full cache and G-KV):
    per model (this task's untrained one, then per recipe over seeds) pass@1 with the full cache, under G-KV and
    under each rule at the training budget, and the share of G-KV's gap to the full cache each rule closes."""
    table = (section.get("cross") or {}).get("recipes") or {}
    train = f"gkv-b{section['settings']['train']['budget']}"
    rules = [c for c in table if c not in ("full", train)]
    if not rules or not table.get("full") or not table.get(train):
        return "(no rule evaluated yet)\n"
    lines = [
        f"| model | seeds | full | {train} | " + " | ".join(f"{rule} | gap closed ({rule})" for rule in rules) + " |",
        "|---|---|---|---|" + "---|---|" * len(rules),
    ]
    for name in dict.fromkeys(n for c in table.values() for n in c):
        full, compressed = table["full"].get(name), table[train].get(name)
        cells = []
        for rule in rules:
            row = table[rule].get(name)
            closed = (
                gap_closed(row["pass@1"], compressed["pass@1"], full["pass@1"]) if row and full and compressed else "-"
            )
            cells += [cell(row) if row else "-", closed]
        seeds = max(table[c][name]["seeds"] for c in table if name in table[c])
        shown = [cell(r) if r else "-" for r in (full, compressed)]
        lines.append(f"| {name} | {seeds} | " + " | ".join(shown + cells) + " |")
    return "\n".join(lines) + "\n"


def lr_table(section: dict) -> str:
    lines = ["| learning rate | pass@1 (train split) | score | length |", "|---|---|---|---|"]
    if not section.get("lr_sweep") and section.get("learning_rate") is not None:
        lines.append(f"| {lr_name(section['learning_rate'])} (given: --lr, no sweep) | - | - | - |")
    for lr, r in section.get("lr_sweep", {}).items():
        if r is None:
            lines.append(f"| {lr} | - | - | - |")
            continue
        lo, hi = r["pass@1_ci95"]
        chosen = (
            " (chosen)" if section.get("learning_rate") is not None and lr_name(section["learning_rate"]) == lr else ""
        )
        lines.append(
            f"| {lr}{chosen} | {r['pass@1']:.3f} [{lo:.2f}, {hi:.2f}] | {r['score']:.3f} | "
            f"{r['mean_completion_length']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def tables(view: str, result: dict) -> str:
    """``scripts/render_docs.py``'s views: ``probe``, ``methods`` (the ordering tables), ``lr``, ``training``,
    ``rounds``, ``drift``, ``differences``, ``judged`` (issue 53's pre-registered comparison), ``cross`` (the
    models of --cross-adapters here), ``controls`` (the training-free rules and the share of the gap each closes),
    ``cost`` (seconds per training step), ``writing`` (where ``count_recall`` completions restate the code)."""
    if view in ("probe", "methods"):
        checks = "".join(
            f"- {name.replace('_', ' ')} {want}: {'yes' if ok else 'NO'}\n"
            for name, (want, ok) in result[view].get("checks", {}).items()
        )
        state = " (partial: rows still running)" if result[view].get("partial") else ""
        table = f"{ordering_table(result[view])}\n{provenance(result[view])}{state}\n"
        return table + (f"\nRegime checks (train split):\n{checks}" if checks else "")
    section = result["training"]
    body = {
        "lr": lr_table,
        "training": training_table,
        "rounds": rounds_table,
        "drift": drift_table,
        "differences": differences_table,
        "judged": judged_table,
        "cross": cross_table,
        "controls": controls_table,
        "cost": cost_table,
        "writing": writing_table,
    }[view](section)
    state = " (partial: jobs of its command not done)" if section.get("partial") else ""
    return f"{body}\n{provenance(section)}{state}\n"


def figures(section: dict, path: Path) -> None:
    """Training curves with seed bands (per recipe: mean and min-max over seeds) of the reward of each step's
    rollouts, the mismatch telemetry (agreement p5, token ratio p1, share of tokens left out of the loss) and the
    rollouts' mean completion length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("reward", "reward of the step's rollouts"),
        ("mismatch/agreement_p5", "agreement p5"),
        ("mismatch/ratio_p1", "token ratio p1"),
        ("sampling/rollout_tokens_dropped", "tokens left out (sparse_rl)"),
        ("completions/mean_length", "mean completion length"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    found = {m["recipe"] for m in section["models"].values() if "recipe" in m}
    variants = sorted(found - set(RECIPES))
    recipes = [r for r in RECIPES if r in found] + variants
    colors = {r: f"C{(RECIPES + tuple(variants)).index(r)}" for r in recipes}  # the same in every figure
    for ax, (key, title) in zip(axes, panels):
        for recipe in recipes:
            curves = [m.get("curve", {}).get(key, []) for m in section["models"].values() if m.get("recipe") == recipe]
            curves = [c for c in curves if c]
            if not curves:
                continue
            steps = sorted({s for c in curves for s, _ in c})
            values = [[dict(c).get(s) for c in curves] for s in steps]
            mean = [sum(v for v in vs if v is not None) / max(1, sum(v is not None for v in vs)) for vs in values]
            low = [min((v for v in vs if v is not None), default=math.nan) for vs in values]
            high = [max((v for v in vs if v is not None), default=math.nan) for vs in values]
            ax.plot(steps, mean, color=colors[recipe], label=f"{recipe} ({len(curves)} seeds)")
            ax.fill_between(steps, low, high, color=colors[recipe], alpha=0.2)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("optimizer step")
        if ax.lines:
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
