"""An evaluation's summaries for people and tools: the results table, figures (one style per method), the
lm-evaluation-harness results layout, and the software versions that made them."""

from __future__ import annotations

import collections
import zlib
from pathlib import Path

from gkv_rollout.registry import registered

MARKERS = "osD^vP*Xh<>p"


def results_table(summaries: list[dict]) -> str:
    """pass@1 [95% interval] and retention, one row per method and one column per budget (plain text)."""
    budgets = sorted({s["budget"] for s in summaries if s["budget"] is not None})
    methods = list(dict.fromkeys(s["compression"]["method"] for s in summaries))

    def cell(s):
        low, high = s["pass@1_ci95"]
        ci = "" if low is None else f" [{low:.2f},{high:.2f}]"
        return f"{s['pass@1']:.3f}{ci} r{s['retention']:.2f}" if s["pass@1"] is not None else "-"

    rows = [["method", *(["all"] if not budgets else [f"budget {b}" for b in budgets])]]
    for method in methods:
        runs = [s for s in summaries if s["compression"]["method"] == method]
        if all(s["budget"] is None for s in runs) or not budgets:  # full, or a method that reads no budget
            rows.append([method, *[cell(runs[0])] * max(len(budgets), 1)])
        else:
            by_budget = {s["budget"]: s for s in runs}
            rows.append([method, *[cell(by_budget[b]) if b in by_budget else "-" for b in budgets]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(["pass@1 [95% interval] r<retention>", *lines])


def method_style(method: str) -> dict:
    """One colour and marker per method in every figure: the full cache black, a registered method by its place in
    the registry, any other name (a user's method, a bench's variant) by a hash of it."""
    if method == "full":
        return {"color": "black", "marker": "s"}
    names = [m for m in registered() if m != "full"]
    index = names.index(method) if method in names else len(names) + zlib.crc32(method.encode()) % 7
    return {"color": f"C{index % 10}", "marker": MARKERS[index % len(MARKERS)]}


def plot_summaries(summaries: list[dict], out_dir: Path, title: str) -> list[Path]:
    """``pass_at_1_vs_budget.png``: pass@1 with 95% intervals against budget per method (full: a line with its
    band); ``retained_density.png``: absolute retention by relative position, and the density of retained
    positions, per run. ``title`` names the model, data and n."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(6.5, 4))
    budgets = sorted({s["budget"] for s in summaries if s["budget"] is not None})
    methods = list(dict.fromkeys(s["compression"]["method"] for s in summaries if s["budget"] is not None))
    for method in dict.fromkeys(s["compression"]["method"] for s in summaries):
        runs = [s for s in summaries if s["compression"]["method"] == method]
        if all(s["budget"] is None for s in runs):  # full, or a method that reads no budget: a line across
            run, style = runs[0], method_style(method)
            label = "full cache" if method == "full" else method
            ax.axhline(run["pass@1"], color=style["color"], linestyle="--", label=label)
            if run["pass@1_ci95"][0] is not None:
                ax.axhspan(*run["pass@1_ci95"], color=style["color"], alpha=0.08)
            continue
        runs = sorted((s for s in runs if s["budget"] is not None), key=lambda s: s["budget"])
        # methods side by side around each budget (3% apart on the log axis), so equal points stay visible
        dodge = 1.03 ** (methods.index(method) - (len(methods) - 1) / 2)
        x = [r["budget"] * dodge for r in runs]
        y = [r["pass@1"] for r in runs]
        err = [[r["pass@1"] - r["pass@1_ci95"][0] for r in runs], [r["pass@1_ci95"][1] - r["pass@1"] for r in runs]]
        ax.errorbar(x, y, yerr=err, capsize=3, label=method, markerfacecolor="none", **method_style(method))
    ax.set_xlabel("budget (tokens per layer and KV head)")
    ax.set_ylabel("pass@1 (95% bootstrap interval)")
    ax.set_ylim(0, 1)
    if budgets:
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.minorticks_off()
    ax.set_title(title, fontsize=9)
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    paths.append(out_dir / "pass_at_1_vs_budget.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    paths.append(plot_retained_density(summaries, out_dir / "retained_density.png", title))
    return paths


def plot_retained_density(summaries: list[dict], path: Path, title: str) -> Path:
    """Absolute retention by relative position (top) and the density of retained positions (bottom), one line
    per run summary (``summarize``'s, with ``run`` and ``compression``): colour by method, line style by budget
    (G-KV's Fig. 7); runs of one method at one budget (variants, e.g. G-KV's history forms) take the next line
    styles. Returns ``path``."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = sorted({s["budget"] for s in summaries if s["budget"] is not None})
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    styles, seen = {b: i for i, b in enumerate(budgets)}, collections.Counter()
    for s in summaries:
        method = "full" if s["run"] == "full" else s["compression"]["method"]
        budget = s["budget"]
        seen[method, budget] += 1
        linestyle = ("-", "--", ":", "-.")[(styles.get(budget, 0) + (seen[method, budget] - 1) * len(budgets)) % 4]
        share = s["retention_by_position"]
        centres = [(i + 0.5) / len(share) for i in range(len(share))]
        label = f"{s['run']} (retention {s['retention']:.2f})" if s["retention"] is not None else s["run"]
        style = dict(color=method_style(method)["color"], linestyle=linestyle, linewidth=1.2)
        top.plot(centres, share, label=label, **style)
        bottom.plot(centres, s["retained_density"], **style)
    top.set_ylabel("share of tokens retained")
    top.set_ylim(0, 1.05)
    bottom.set_ylabel("density of retained tokens")
    bottom.set_ylim(bottom=0)
    bottom.set_xlabel("position / sequence length (at the last decoding step)")
    top.set_title(textwrap.fill(title, 80), fontsize=9)
    top.legend(loc="center left", bbox_to_anchor=(1.02, 0.0), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def software_versions() -> dict:
    """Python and the packages that determine results, and the source tree's git commit when there is one."""
    import platform
    import subprocess
    from importlib import metadata

    found = {"python": platform.python_version()}
    for package in ("gkv-train", "torch", "transformers", "trl", "peft", "accelerate", "math-verify"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None

    def git(*args) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    found["git_commit"] = git("rev-parse", "HEAD")
    # uncommitted changes to tracked files: the commit alone does not say what ran (None outside a checkout)
    changes = git("status", "--porcelain", "--untracked-files=no") if found["git_commit"] else None
    found["git_dirty"] = None if changes is None else bool(changes)
    return found


def lm_eval_results(summaries: list[dict], task: str, config: dict, versions: dict) -> dict:
    """The evaluation in lm-evaluation-harness's results layout (``results``, ``configs``, ``versions``,
    ``n-shot``, ``higher_is_better``, ``n-samples``, ``config``), one task per run named ``<task>_<run>``,
    metrics keyed ``<metric>,<filter>`` with filter ``none`` (pass@k, pass@1's standard error over problems,
    retention, mean completion length)."""
    tasks = {f"{task}_{s['run']}": s for s in summaries}
    results, configs = {}, {}
    for name, s in tasks.items():
        results[name] = {
            "alias": name,
            **{f"{k},none": v for k, v in s.items() if k.startswith("pass@") and k[5:].isdigit()},
            "pass@1_stderr,none": s["pass@1_stderr"],
            "retention,none": s["retention"],
            "mean_completion_length,none": s["mean_completion_length"],
        }
        configs[name] = {
            "task": name,
            "dataset_path": config["data"].get("path") or config["data"].get("name"),
            "output_type": "generate_until",
            "num_fewshot": 0,
            "repeats": s["samples_per_problem"],
            "generation_kwargs": {
                "max_new_tokens": config["max_completion_length"],
                "temperature": config["temperature"],
                "top_p": config["top_p"],
            },
            "compression": s["compression"],
            "metric_list": [{"metric": "pass@1", "aggregation": "mean", "higher_is_better": True}],
        }
    return {
        "results": results,
        "configs": configs,
        "versions": {name: 1.0 for name in tasks},
        "n-shot": {name: 0 for name in tasks},
        "higher_is_better": {name: {"pass@1": True} for name in tasks},
        "n-samples": {name: {"original": s["problems"], "effective": s["problems"]} for name, s in tasks.items()},
        "config": {
            "model": "gkv-train",
            "model_args": f"pretrained={config['model']},adapter={config['adapter']}",
            "batch_size": config["batch_problems"],
            "random_seed": config["seed"],
        },
        "model_name": config["model"],
        "transformers_version": versions.get("transformers"),
        "git_hash": versions.get("git_commit"),
    }
