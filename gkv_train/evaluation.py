"""pass@k evaluation of a model under compressed caches: samples, summaries, resumable runs, plots."""

from __future__ import annotations

import hashlib
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from gkv_train.jsonio import dumps, read_jsonl, write_atomically
from gkv_train.logprobs import chunked_divergence, decoder_and_head, hidden_states
from rewards.grading import grade_completions
from rewards.verify import MathVerifier
from rollout.config import CompressionConfig, SamplingConfig
from rollout.engine import RolloutEngine

DENSITY_BINS = 50
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


def retained_density(record, prompt_lengths, completion_lengths, bins: int = DENSITY_BINS) -> list[float]:
    """Where the kept tokens sit: a histogram over the normalised position k / T of the tokens still attended to
    at each sequence's end (``kept_at_end``), summed over the batch."""
    counts = torch.zeros(bins, dtype=torch.float64)
    for b in range(prompt_lengths.shape[0]):
        kept = kept_at_end(record, prompt_lengths, completion_lengths, b)
        length = kept.shape[-1]
        which = ((torch.arange(length).float() + 0.5) / length * bins).long().clamp_max(bins - 1)
        counts += torch.bincount(which, weights=kept.sum(0).double(), minlength=bins)
    return counts.tolist()


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
    _, head = decoder_and_head(model)
    _, teacher_head = decoder_and_head(teacher)
    total, tokens = 0.0, 0
    for start in range(0, len(traces), batch):
        rows = traces[start : start + batch]
        out = engine.replay([r["prompt"] for r in rows], [r["completion_ids"] for r in rows])
        C, real = out.num_completion_tokens, out.completion_mask.bool()
        targets = out.sequences[:, -C:][real]
        with torch.no_grad():
            student = hidden_states(model, out.sequences, out.attention_mask, out.record)[:, -C - 1 : -1][real]
            reference = hidden_states(teacher, out.sequences, out.attention_mask)[:, -C - 1 : -1][real]
            total += chunked_divergence(
                student, reference, head, teacher_head, targets, "forward_kl", 1.0, chunk_tokens
            ).item()
        tokens += int(real.sum())
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
    densities = {r.get("batch"): r for r in read_jsonl(density_path)}  # a re-run batch's line replaces the old
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
) -> dict:
    """Sample ``sampling.num_samples`` completions per problem under ``compression`` and score them.

    Appends one JSON line per sample to ``out_dir/samples.jsonl`` batch by batch; a batch already there (an
    interrupted run) is not recomputed (``out_dir`` must be claimed first: ``claim_run_dir``). Each batch's seed
    depends only on its index, so a resumed run produces what an uninterrupted one would. Returns the summary
    (also written to ``out_dir/summary.json``).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    samples_path, density_path = out_dir / "samples.jsonl", out_dir / "density.jsonl"
    batches = [range(i, min(i + batch_problems, len(problems))) for i in range(0, len(problems), batch_problems)]
    done = finished_batches(samples_path, density_path, batches, sampling.num_samples)
    engine = RolloutEngine(model, tokenizer, compression)
    verify = MathVerifier()
    progress = tqdm(batches, desc=run_name(compression), unit="batch")
    tally = [0, 0]  # correct, samples of the batches computed now
    for index, rows in enumerate(progress):
        if index in done:
            continue
        batch = problems.select(rows)
        prompts = [prompt_template.format(problem=p) for p in batch["problem"]]
        out = engine.generate(prompts, SamplingConfig(**{**asdict(sampling), "seed": sampling.seed + index}))
        n = sampling.num_samples
        golds = [gold for gold in batch["answer"] for _ in range(n)]
        lines = []
        for i, grade in enumerate(grade_completions(tokenizer, out.completions(), golds, verify)):
            lines.append({
                "batch": index,
                "problem_id": batch["id"][i // n],
                "sample": i % n,
                "completion": grade.text,
                "extracted": grade.answer,
                "gold": golds[i],
                "correct": grade.correct,
                "check_timed_out": grade.timed_out,
                "length": int(out.completion_lengths[i]),
                "retention": out.retention[i].item(),
                "tokens_per_s": out.stats["tokens_per_s"],
            })
        density = retained_density(out.record, out.prompt_lengths, out.completion_lengths)
        with open(density_path, "a") as f:  # before the samples: a batch counts as done once its samples are in
            f.write(dumps({"batch": index, "density": density}) + "\n")
        with open(samples_path, "a") as f:
            f.write("".join(dumps(line) + "\n" for line in lines))
        tally[0] += sum(line["correct"] for line in lines)
        tally[1] += len(lines)
        progress.set_postfix(accuracy=f"{tally[0] / tally[1]:.3f}")
    verify.close()
    in_order = sorted(read_jsonl(samples_path), key=lambda s: (s["batch"], s["problem_id"], s["sample"]))
    write_atomically(samples_path, "".join(dumps(s) + "\n" for s in in_order))  # recomputed batches in place
    summary = summarize(samples_path, density_path, sampling.num_samples)
    summary.update(run=run_name(compression), compression=asdict(compression.resolved()))
    if summary["verifier_timeouts"]:
        print(f"{run_name(compression)}: {summary['verifier_timeouts']} answer checks timed out (scored 0)", file=sys.stderr)
    write_atomically(out_dir / "summary.json", dumps(summary, indent=2))
    return summary


def summarize(samples_path: Path, density_path: Path, n: int) -> dict:
    """pass@k (k = 1..n, averaged over problems), lengths, retention (all / correct samples), tokens/s, answer
    checks and their timeouts. Empty means are None (null in JSON)."""
    samples = read_jsonl(samples_path)
    by_problem: dict = {}
    for s in samples:
        by_problem.setdefault(s["problem_id"], []).append(s["correct"])
    correct = [s for s in samples if s["correct"]]
    batches = {}
    for record in read_jsonl(density_path):
        batches[record["batch"]] = record["density"]  # a re-run batch replaces its partial line
    density = torch.tensor(list(batches.values()), dtype=torch.float64).sum(0)

    def mean(values):
        return sum(values) / len(values) if values else None

    return {
        "problems": len(by_problem),
        "samples_per_problem": n,
        **{f"pass@{k}": mean([pass_at_k(n, sum(c), k) for c in by_problem.values()]) for k in range(1, n + 1)},
        "mean_completion_length": mean([s["length"] for s in samples]),
        "retention": mean([s["retention"] for s in samples]),
        "retention_correct": mean([s["retention"] for s in correct]),
        "tokens_per_s": mean([s["tokens_per_s"] for s in samples]),
        "verifier_checks": len(samples),
        "verifier_timeouts": sum(s.get("check_timed_out", False) for s in samples),
        "retained_density": (density / density.sum().clamp_min(1)).tolist(),
    }


def plot_summaries(summaries: list[dict], out_dir: Path) -> list[Path]:
    """pass@1 against budget per method, and the density of retained positions per run (PNG files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(5, 3.5))
    methods = sorted({s["compression"]["method"] for s in summaries})
    budgets = sorted({s["compression"]["budget"] for s in summaries if s["compression"]["method"] != "full"})
    for method in methods:
        runs = sorted((s for s in summaries if s["compression"]["method"] == method), key=lambda s: s["compression"]["budget"])
        if method == "full":
            for run in runs:
                ax.axhline(run["pass@1"], color="black", linestyle="--", label="full")
        else:
            ax.plot([r["compression"]["budget"] for r in runs], [r["pass@1"] for r in runs], marker="o", label=method)
    ax.set_xlabel("budget (tokens per layer and KV head)")
    ax.set_ylabel("pass@1")
    if budgets:
        ax.set_xticks(budgets)
    ax.legend()
    fig.tight_layout()
    paths.append(out_dir / "pass_at_1_vs_budget.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for s in summaries:
        density = s["retained_density"]
        centres = [(i + 0.5) / len(density) for i in range(len(density))]
        ax.plot(centres, [d * len(density) for d in density], label=s["run"])
    ax.set_xlabel("position / sequence length")
    ax.set_ylabel("density of retained tokens")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / "retained_density.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths

