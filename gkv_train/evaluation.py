"""pass@k evaluation of a model under compressed caches: samples, summaries, resumable runs, plots."""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
import time
import zlib
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from gkv_train.console import log_console_to
from gkv_train.data import load_problems, local_file
from gkv_train.exits import refusing
from gkv_train.graded import generate_and_grade
from gkv_train.jsonio import dumps, read_jsonl, write_atomically
from gkv_train.logprobs import divergence_under_record
from gkv_train.models import check_model, load_model, model_identity
from gkv_train.preflight import Generation, check_generations
from gkv_rewards.verify import MathVerifier, warn_unverified
from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_rollout.engine import RolloutEngine
from gkv_rollout.methods import METHODS
from gkv_train.runlock import RunLock
from gkv_train.storage import check_output_dir, naming_full_disk

DENSITY_BINS = 50
MARKERS = "osD^vP*Xh<>p"
RUN_SETTINGS = "run.json"
RUN_FILES = ("samples.jsonl", "density.jsonl", "summary.json", RUN_SETTINGS)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` correct among ``n`` samples (Chen et al., 2021):
    1 - C(n - c, k) / C(n, k)."""
    if not 0 < k <= n:
        raise ValueError(f"pass@k needs 0 < k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def kept_at_end(record, prompt_lengths: torch.Tensor, completion_lengths: torch.Tensor, b: int) -> torch.Tensor:
    """bool [parts, T_b - 1]: which of sequence b's tokens its last decoding query (at position T_b - 2: the
    final token is sampled, never fed) attended to, per (layer, KV head) or layer (``Record.kept_at``);
    everything for the full cache (None)."""
    position = max(int(prompt_lengths[b] + completion_lengths[b]) - 2, 0)
    if record is None:
        return torch.ones(1, position + 1, dtype=torch.bool)
    return record.kept_at(b, position)


def position_overlap(length: int, bins: int = DENSITY_BINS) -> torch.Tensor:
    """float64 [length, bins]: the share of bin j's span [j/bins, (j+1)/bins) covered by token k's span
    [k/length, (k+1)/length), times ``bins`` (so each bin's column sums to 1 when every token is present; no
    binning artefacts whether or not ``length`` is a multiple of ``bins``)."""
    k = torch.arange(length, dtype=torch.float64)[:, None]
    j = torch.arange(bins, dtype=torch.float64)[None, :]
    low = torch.maximum(k / length, j / bins)
    high = torch.minimum((k + 1) / length, (j + 1) / bins)
    return (high - low).clamp_min(0) * bins


def retained_by_position(
    record, prompt_lengths, completion_lengths, bins: int = DENSITY_BINS
) -> tuple[list[float], list[float]]:
    """Where the tokens still attended to at each sequence's end (``kept_at_end``) sit, over the normalised
    position k / T in ``bins`` bins, summed over the batch: (kept, present), each [bins]. ``kept`` counts a token
    by the share of (layer, KV head) parts that keep it; ``present`` counts every token. kept / present is the
    absolute retention at that relative position (1 for the full cache); kept / sum(kept) * bins is the density
    of retained positions (the G-KV paper's Figure 7)."""
    kept = torch.zeros(bins, dtype=torch.float64)
    present = torch.zeros(bins, dtype=torch.float64)
    for b in range(prompt_lengths.shape[0]):
        share = kept_at_end(record, prompt_lengths, completion_lengths, b).double().mean(0)  # [T_b - 1]
        overlap = position_overlap(share.shape[0], bins)
        kept += share @ overlap
        present += overlap.sum(0)
    return kept.tolist(), present.tolist()


def bootstrap_interval(per_problem: list[float], resamples: int = 4000, seed: int = 0) -> list[float]:
    """95% percentile bootstrap interval of the mean of ``per_problem`` (each problem's share of correct
    samples: the samples of one problem are not independent, so problems are resampled)."""
    if not per_problem:
        return [None, None]
    rng = random.Random(seed)
    n = len(per_problem)
    means = sorted(sum(rng.choices(per_problem, k=n)) / n for _ in range(resamples))
    return [means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]]


def compressed_kl(
    teacher, model, tokenizer, traces: list[dict], compression: CompressionConfig, batch: int = 8,
    chunk_tokens: int = 512,
) -> dict:
    """Mean per-token KL(teacher with the full cache || ``model`` under ``compression``) over the completion
    tokens of ``traces`` (rows with ``prompt`` and ``completion_ids``, e.g. teacher traces of held-out problems).
    Each trace is replayed through the model's compressed cache (``RolloutEngine.replay``: the record a rollout
    of those tokens would have), and the model attends under that record; distributions at temperature 1.

    Returns {"kl": mean over tokens, "tokens": count, "traces": count}.
    """
    engine = RolloutEngine(model, tokenizer, compression)
    total, tokens = 0.0, 0
    for start in range(0, len(traces), batch):
        rows = traces[start : start + batch]
        out = engine.replay([r["prompt"] for r in rows], [r["completion_ids"] for r in rows])
        with torch.no_grad():
            total += divergence_under_record(model, teacher, out, "forward_kl", 1.0, chunk_tokens)[0].item()
        tokens += int(out.completion_mask.sum())
    return {"kl": total / max(tokens, 1), "tokens": tokens, "traces": len(traces)}


def fingerprint(settings: dict) -> str:
    """A short hash of a run's settings (``EvalConfig.run_settings``)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two nested settings dicts."""
    keys = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            keys.append(prefix + key)
    return keys


def claim_run_dir(out_dir: Path, settings: dict, overwrite: bool) -> None:
    """Make ``out_dir`` the folder of the run with ``settings`` (before any work): a folder of the same run is
    kept (its finished batches are reused); one holding results made otherwise (other model weights, data,
    sampling, compression, ...; or of unknown origin) is refused, naming what differs, unless ``overwrite``
    (then its results are deleted)."""
    out_dir = Path(out_dir)
    settings = json.loads(dumps(settings))  # as it reads back (tuples as lists), for a fair comparison
    recorded = out_dir / RUN_SETTINGS
    try:
        old = json.loads(recorded.read_text()) if recorded.is_file() else None
    except json.JSONDecodeError:  # cut by an interruption: of unknown origin
        old = None
    has_results = any((out_dir / name).is_file() for name in RUN_FILES)
    same = old is not None and old.get("fingerprint") == fingerprint(settings)
    if has_results and not same:
        if not overwrite:
            what = "results of unknown settings" if old is None else (
                "results made with other " + ", ".join(differences(old.get("settings", {}), settings))
            )
            raise FileExistsError(
                f"{out_dir} holds {what}: choose another output_dir, or pass overwrite=true to replace them"
            )
    if overwrite or not same:
        for name in RUN_FILES:
            (out_dir / name).unlink(missing_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(recorded, dumps({"fingerprint": fingerprint(settings), "settings": settings}, indent=2))


def finished_batches(samples_path: Path, density_path: Path, batches: list, n: int) -> set[int]:
    """Indices of the batches whose samples (parseable, once each) and density are all written. Both files are
    rewritten to hold only those batches, so damaged or partial batches (each bad line is reported with file
    and line) are recomputed."""
    samples = read_jsonl(samples_path)
    written: dict[int, int] = {}
    for line in samples:
        written[line.get("batch")] = written.get(line.get("batch"), 0) + 1
    # a re-run batch's line replaces the old; lines of an older format (no "kept") count as missing
    densities = {r.get("batch"): r for r in read_jsonl(density_path) if "kept" in r}
    done = {i for i, rows in enumerate(batches) if written.get(i) == len(rows) * n and i in densities}
    redo = sorted(b for b in written if b not in done)
    if redo:
        print(f"{samples_path}: batches {redo} are incomplete or damaged and are recomputed", file=sys.stderr)
    if samples_path.is_file() or density_path.is_file():
        write_atomically(samples_path, "".join(dumps(s) + "\n" for s in samples if s.get("batch") in done))
        write_atomically(density_path, "".join(dumps(densities[b]) + "\n" for b in sorted(done)))
    return done


def run_name(compression: CompressionConfig) -> str:
    return "full" if not compression.compresses else f"{compression.method}-b{compression.budget}"


def evaluate_compression(
    model,
    tokenizer,
    problems,
    compression: CompressionConfig,
    sampling: SamplingConfig,
    out_dir: Path,
    batch_problems: int,
    prompt_template: str,
    progress: tqdm | None = None,
) -> dict:
    """Sample ``sampling.num_samples`` completions per problem under ``compression`` and score them.

    Appends one JSON line per sample to ``out_dir/samples.jsonl`` batch by batch; a batch already there (an
    interrupted run) is not recomputed (``out_dir`` must be claimed first: ``claim_run_dir``). Each batch's seed
    depends only on its index, so a resumed run produces what an uninterrupted one would. Returns the summary
    (also written to ``out_dir/summary.json``). ``progress``: a sweep's bar over every run's batches (one is made
    for this run when None), moved by one per batch, finished ones included.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    samples_path, density_path = out_dir / "samples.jsonl", out_dir / "density.jsonl"
    batches = [range(i, min(i + batch_problems, len(problems))) for i in range(0, len(problems), batch_problems)]
    done = finished_batches(samples_path, density_path, batches, sampling.num_samples)
    engine = RolloutEngine(model, tokenizer, compression)
    verify = MathVerifier()
    own = progress is None
    progress = tqdm(total=len(batches), desc=run_name(compression), unit="batch") if own else progress
    tally = [0, 0]  # correct, samples of the batches computed now
    for index, rows in enumerate(batches):
        if index in done:
            progress.update(1)
            continue
        batch = problems.select(rows)
        prompts = [prompt_template.format(problem=p) for p in batch["problem"]]
        graded = generate_and_grade(engine, tokenizer, batch, prompts,
                                    SamplingConfig(**{**asdict(sampling), "seed": sampling.seed + index}), verify)  # fmt: skip
        out, golds, n = graded.out, graded.golds, sampling.num_samples
        lines = []
        for i, grade in enumerate(graded.grades):
            lines.append({
                "batch": index,
                "problem_id": batch["id"][i // n],
                "sample": i % n,
                "completion": grade.text,
                "extracted": grade.answer,
                "gold": golds[i],
                "correct": grade.correct,
                "check_timed_out": grade.timed_out,
                "check_error": grade.error,
                "copied": grade.copied,
                "length": int(out.completion_lengths[i]),
                "retention": out.retention[i].item(),
                "memory_share": out.memory_share[i].item(),
                "tokens_per_s": out.stats["tokens_per_s"],
                "batch_compressions": out.stats.get("compressions", 0),  # rounds in the batch, the prefill's included
            })
        kept, present = retained_by_position(out.record, out.prompt_lengths, out.completion_lengths)
        with naming_full_disk(out_dir, "evaluation samples"):
            with open(density_path, "a") as f:  # before the samples: a batch counts as done once its samples are in
                f.write(dumps({"batch": index, "kept": kept, "present": present}) + "\n")
            with open(samples_path, "a") as f:
                f.write("".join(dumps(line) + "\n" for line in lines))
        tally[0] += sum(line["correct"] for line in lines)
        tally[1] += len(lines)
        progress.set_postfix(accuracy=f"{tally[0] / tally[1]:.3f}")
        progress.update(1)
    verify.close()
    if own:
        progress.close()
    in_order = sorted(read_jsonl(samples_path), key=lambda s: (s["batch"], s["problem_id"], s["sample"]))
    write_atomically(samples_path, "".join(dumps(s) + "\n" for s in in_order))  # recomputed batches in place
    summary = summarize(samples_path, density_path, sampling.num_samples)
    summary.update(run=run_name(compression), compression=asdict(compression.resolved()))
    warn_unverified(run_name(compression), summary["verifier_timeouts"], summary["verifier_errors"],
                    ", check_error in samples.jsonl")
    write_atomically(out_dir / "summary.json", dumps(summary, indent=2))
    return summary


def summarize(samples_path: Path, density_path: Path, n: int) -> dict:
    """pass@k (k = 1..n, averaged over problems), pass@1's 95% bootstrap interval and standard error over
    problems, lengths, compression rounds per batch,
    retention (all / correct samples; and by relative position, ``retained_by_position``), the cache's persistent
    memory share at the end (``RolloutOutput.memory_share``), tokens/s, answer checks,
    their timeouts and their errors (no verdict). Empty means are None (null in JSON)."""
    samples = read_jsonl(samples_path)
    by_problem: dict = {}
    for s in samples:
        by_problem.setdefault(s["problem_id"], []).append(s["correct"])
    per_problem = [sum(c) / len(c) for c in by_problem.values()]
    correct = [s for s in samples if s["correct"]]
    batches = {record["batch"]: record for record in read_jsonl(density_path) if "kept" in record}
    kept = torch.tensor([r["kept"] for r in batches.values()], dtype=torch.float64).sum(0)
    present = torch.tensor([r["present"] for r in batches.values()], dtype=torch.float64).sum(0)

    def mean(values):
        return sum(values) / len(values) if values else None

    return {
        "problems": len(by_problem),
        "samples_per_problem": n,
        **{f"pass@{k}": mean([pass_at_k(n, sum(c), k) for c in by_problem.values()]) for k in range(1, n + 1)},
        "pass@1_ci95": bootstrap_interval(per_problem),
        "pass@1_stderr": standard_error(per_problem),
        "mean_completion_length": mean([s["length"] for s in samples]),
        "retention": mean([s["retention"] for s in samples]),
        "retention_correct": mean([s["retention"] for s in correct]),
        "memory_share": mean([s["memory_share"] for s in samples if "memory_share" in s]),
        "tokens_per_s": mean([s["tokens_per_s"] for s in samples]),
        "batch_compressions": mean([s.get("batch_compressions", 0) for s in samples]),
        "verifier_checks": len(samples),
        "verifier_timeouts": sum(s.get("check_timed_out", False) for s in samples),
        "verifier_errors": sum(s.get("check_error", False) for s in samples),
        "retention_by_position": (kept / present.clamp_min(1e-12)).tolist(),
        "retained_density": (kept / kept.sum().clamp_min(1e-12) * kept.numel()).tolist(),
    }


def standard_error(values: list[float]) -> float | None:
    """Standard error of the mean of ``values`` (sample standard deviation / sqrt(n)); None below two values."""
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def results_table(summaries: list[dict]) -> str:
    """pass@1 [95% interval] and retention, one row per method and one column per budget (plain text)."""
    budgets = sorted({s["compression"]["budget"] for s in summaries if s["run"] != "full"})
    methods = list(dict.fromkeys(s["compression"]["method"] for s in summaries))

    def cell(s):
        low, high = s["pass@1_ci95"]
        ci = "" if low is None else f" [{low:.2f},{high:.2f}]"
        return f"{s['pass@1']:.3f}{ci} r{s['retention']:.2f}" if s["pass@1"] is not None else "-"

    rows = [["method", *(["all"] if not budgets else [f"budget {b}" for b in budgets])]]
    for method in methods:
        runs = [s for s in summaries if s["compression"]["method"] == method]
        if method == "full" or not budgets:
            rows.append([method, *[cell(runs[0])] * max(len(budgets), 1)])
        else:
            by_budget = {s["compression"]["budget"]: s for s in runs}
            rows.append([method, *[cell(by_budget[b]) if b in by_budget else "-" for b in budgets]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(["pass@1 [95% interval] r<retention>", *lines])


def method_style(method: str) -> dict:
    """One colour and marker per method in every figure: the full cache black, a registered method by its place in
    the registry (then ``s4r``), any other name (a user's method, a bench's variant) by a hash of it."""
    if method == "full":
        return {"color": "black", "marker": "s"}
    names = [m for m in METHODS if m != "full"] + ["s4r"]
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
    budgets = sorted({s["compression"]["budget"] for s in summaries if s["run"] != "full"})
    methods = list(dict.fromkeys(s["compression"]["method"] for s in summaries if s["run"] != "full"))
    for method in dict.fromkeys(s["compression"]["method"] for s in summaries):
        runs = sorted((s for s in summaries if s["compression"]["method"] == method), key=lambda s: s["compression"]["budget"])
        if method == "full":
            run = runs[0]
            ax.axhline(run["pass@1"], color="black", linestyle="--", label="full cache")
            if run["pass@1_ci95"][0] is not None:
                ax.axhspan(*run["pass@1_ci95"], color="black", alpha=0.08)
            continue
        # methods side by side around each budget (3% apart on the log axis), so equal points stay visible
        dodge = 1.03 ** (methods.index(method) - (len(methods) - 1) / 2)
        x = [r["compression"]["budget"] * dodge for r in runs]
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
    (G-KV's Fig. 7). Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = sorted({s["compression"]["budget"] for s in summaries if s["run"] != "full"})
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    styles = {b: ("-", "--", ":", "-.")[i % 4] for i, b in enumerate(budgets)}
    for s in summaries:
        share = s["retention_by_position"]
        centres = [(i + 0.5) / len(share) for i in range(len(share))]
        label = f"{s['run']} (retention {s['retention']:.2f})" if s["retention"] is not None else s["run"]
        style = dict(color=method_style("full" if s["run"] == "full" else s["compression"]["method"])["color"],
                     linestyle=styles.get(s["compression"]["budget"], "-"), linewidth=1.2)  # fmt: skip
        top.plot(centres, share, label=label, **style)
        bottom.plot(centres, s["retained_density"], **style)
    top.set_ylabel("share of tokens retained")
    top.set_ylim(0, 1.05)
    bottom.set_ylabel("density of retained tokens")
    bottom.set_ylim(bottom=0)
    bottom.set_xlabel("position / sequence length (at the last decoding step)")
    top.set_title(title, fontsize=9)
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
            done = subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True,
                                  timeout=10, check=False)  # fmt: skip
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
            "generation_kwargs": {k: config[k] for k in ("max_new_tokens", "temperature", "top_p")},
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
        "config": {"model": "gkv-train", "model_args": f"pretrained={config['model']},adapter={config['adapter']}",
                   "batch_size": config["batch_problems"], "random_seed": config["seed"]},
        "model_name": config["model"],
        "transformers_version": versions.get("transformers"),
        "git_hash": versions.get("git_commit"),
    }


def run_evaluation(config, settings: dict, config_files: dict[str, str] | None = None) -> dict:
    """``scripts/evaluate.py`` / ``gkv-train evaluate``: every run of ``config`` (an ``EvalConfig``, whose
    ``settings`` as plain values go into the summaries), the files described there; returns the JSON line's
    record (also printed). Everything is checked before any work (``refusing``): the runs, model, data, the
    context and memory the rollouts need, ``output_dir``; then ``output_dir`` is locked for this call
    (``RunLock``: a second evaluation into it is refused while this one runs), its run folders claimed, and
    ``config_files`` (name -> text: the resolved configuration) written under ``output_dir/hydra``."""
    out_dir = Path(config.output_dir)
    with refusing():
        runs = config.compressions()
        for name in (config.model, config.adapter):
            if name is not None:
                check_model(name)
        problems = load_problems(config.data, config.seed)
        check_output_dir(out_dir, "output_dir")
        prompts = [config.data.prompt_template.format(problem=p) for p in problems["problem"]]
        rows = min(config.batch_problems, len(problems)) * config.num_generations
        generation = Generation("evaluation", prompts, problems["id"], rows, config.max_new_tokens, runs)
        check_generations(config.model, [generation], dtype_bytes=2 if config.precision == "bf16" else 4, device="cpu")
        out_dir.mkdir(parents=True, exist_ok=True)
        lock = RunLock.acquire(out_dir, "output_dir")
        try:
            for compression in runs:
                claim_run_dir(out_dir / run_name(compression), config.run_settings(compression), config.overwrite)
        except BaseException:
            lock.release()
            raise
    with lock:
        for name, text in (config_files or {}).items():
            (out_dir / "hydra").mkdir(exist_ok=True)
            write_atomically(out_dir / "hydra" / name, text)
        return _evaluate(config, settings, runs, problems, out_dir)


def _evaluate(config, settings: dict, runs: list[CompressionConfig], problems, out_dir: Path) -> dict:
    """The work of ``run_evaluation`` once everything is checked and ``out_dir`` is locked and claimed."""
    data = config.data
    log_console_to(out_dir / "evaluate.log")
    for warning in config.warnings():
        print(f"warning: {warning}", file=sys.stderr)
    model, tokenizer = load_model(config.model, dtype=torch.bfloat16 if config.precision == "bf16" else torch.float32)
    if config.adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, config.adapter).merge_and_unload()
    sampling = SamplingConfig(
        max_new_tokens=config.max_new_tokens, temperature=config.temperature, top_p=config.top_p,
        num_samples=config.num_generations, seed=config.seed, compile_decode=config.compile_decode,
    )
    batches = math.ceil(len(problems) / config.batch_problems)
    summaries = []
    with tqdm(total=batches * len(runs), unit="batch") as sweep:  # one bar over the sweep: every run's batches
        for i, compression in enumerate(runs):
            sweep.set_description(f"{run_name(compression)} (run {i + 1}/{len(runs)})")
            summaries.append(evaluate_compression(
                model, tokenizer, problems, compression, sampling, out_dir / run_name(compression),
                config.batch_problems, data.prompt_template, progress=sweep,
            ))  # fmt: skip
    versions = software_versions()
    identity = {"model": model_identity(config.model),
                "adapter": None if config.adapter is None else model_identity(config.adapter)}  # fmt: skip
    data_name = data.name or local_file(data.path, None, data.split).stem
    write_atomically(out_dir / "summary.json", dumps(
        {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "config": settings, **identity, "data": data.identity(),
         "versions": versions, "runs": summaries}, indent=2,
    ))  # fmt: skip
    results = lm_eval_results(summaries, data_name, settings, versions)
    write_atomically(out_dir / "results.json", dumps({**results, "date": time.time()}, indent=2))
    title = f"{config.model}{' + ' + config.adapter if config.adapter else ''} · {data_name} · " \
            f"{summaries[0]['problems']} problems x {config.num_generations} samples"
    if config.plots:
        plot_summaries(summaries, out_dir, title)
    print(title + "\n" + results_table(summaries), file=sys.stderr, flush=True)
    hidden = ("retained_density", "retention_by_position", "compression")
    compact = [{k: v for k, v in s.items() if k not in hidden} for s in summaries]
    result = {"evaluation": data_name, "model": config.model, "output_dir": str(out_dir), "runs": compact}
    print(dumps(result), flush=True)
    return result

