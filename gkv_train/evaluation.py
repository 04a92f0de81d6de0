"""pass@k evaluation of a model under compressed caches: samples, summaries, resumable runs, plots."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from gkv_train.s4r import S4RRecord, unpack_bits
from rewards.extract import extract_answer
from rewards.verify import MathVerifier
from rollout.config import CompressionConfig, SamplingConfig
from rollout.engine import RolloutEngine

DENSITY_BINS = 50


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` correct among ``n`` samples (Chen et al., 2021):
    1 - C(n - c, k) / C(n, k)."""
    if not 0 < k <= n:
        raise ValueError(f"pass@k needs 0 < k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def kept_at_end(record, prompt_lengths: torch.Tensor, completion_lengths: torch.Tensor, b: int) -> torch.Tensor:
    """bool [rows, T_b]: which of sequence b's tokens each (layer, KV head) -- each layer for S4R -- still
    attends to at its end. G-KV family: not evicted by the last token; S4R: the sinks and what the last
    decoding query reconstructed; full cache (None): everything."""
    length = int(prompt_lengths[b] + completion_lengths[b])
    if record is None:
        return torch.ones(1, length, dtype=torch.bool)
    if isinstance(record, S4RRecord):
        last = max(int(completion_lengths[b]) - 2, 0)
        rows = unpack_bits(record.selected[b, :, last], length)
        rows[:, : int(record.sinks[b])] = True
        return rows
    return (record[b, :, :, :length] > length - 1).reshape(-1, length)


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


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSONL file; a last line cut short by an interruption is ignored."""
    if not path.is_file():
        return []
    records = []
    for line in open(path):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


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
    interrupted run) is not recomputed. Each batch's seed depends only on its index, so a resumed run produces
    what an uninterrupted one would. Returns the summary (also written to ``out_dir/summary.json``).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    samples_path, density_path = out_dir / "samples.jsonl", out_dir / "density.jsonl"
    batches = [range(i, min(i + batch_problems, len(problems))) for i in range(0, len(problems), batch_problems)]
    written: dict[int, int] = {}
    for line in read_jsonl(samples_path):
        written[line["batch"]] = written.get(line["batch"], 0) + 1
    done = {i for i, rows in enumerate(batches) if written.get(i) == len(rows) * sampling.num_samples}
    if len(done) < len(written):  # a batch cut short by an interruption: keep only the complete ones
        kept = [line for line in read_jsonl(samples_path) if line["batch"] in done]
        samples_path.write_text("".join(json.dumps(line) + "\n" for line in kept))
    engine = RolloutEngine(model, tokenizer, compression)
    verify = MathVerifier()
    progress = tqdm(batches, desc=run_name(compression), unit="batch")
    for index, rows in enumerate(progress):
        if index in done:
            continue
        batch = problems.select(rows)
        prompts = [prompt_template.format(problem=p) for p in batch["problem"]]
        out = engine.generate(prompts, SamplingConfig(**{**asdict(sampling), "seed": sampling.seed + index}))
        texts = tokenizer.batch_decode(out.completions(), skip_special_tokens=True)
        n = sampling.num_samples
        lines = []
        for i, text in enumerate(texts):
            row = i // n
            answer = extract_answer(text)
            lines.append({
                "batch": index,
                "problem_id": batch["id"][row],
                "sample": i % n,
                "completion": text,
                "extracted": answer,
                "gold": batch["answer"][row],
                "correct": verify(answer, batch["answer"][row]),
                "length": int(out.completion_lengths[i]),
                "retention": out.retention[i].item(),
                "tokens_per_s": out.stats["tokens_per_s"],
            })
        density = retained_density(out.record, out.prompt_lengths, out.completion_lengths)
        with open(density_path, "a") as f:  # before the samples: a batch counts as done once its samples are in
            f.write(json.dumps({"batch": index, "density": density}) + "\n")
        with open(samples_path, "a") as f:
            f.write("".join(json.dumps(line) + "\n" for line in lines))
        seen = read_jsonl(samples_path)
        progress.set_postfix(accuracy=f"{sum(s['correct'] for s in seen) / len(seen):.3f}")
    verify.close()
    summary = summarize(samples_path, density_path, sampling.num_samples)
    summary.update(run=run_name(compression), compression=asdict(compression))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def summarize(samples_path: Path, density_path: Path, n: int) -> dict:
    """pass@k (k = 1..n, averaged over problems), lengths, retention (all / correct samples), tokens/s."""
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
        return sum(values) / len(values) if values else float("nan")

    return {
        "problems": len(by_problem),
        "samples_per_problem": n,
        **{f"pass@{k}": mean([pass_at_k(n, sum(c), k) for c in by_problem.values()]) for k in range(1, n + 1)},
        "mean_completion_length": mean([s["length"] for s in samples]),
        "retention": mean([s["retention"] for s in samples]),
        "retention_correct": mean([s["retention"] for s in correct]),
        "tokens_per_s": mean([s["tokens_per_s"] for s in samples]),
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

