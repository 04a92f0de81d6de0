"""pass@k evaluation of a model under compressed caches: each run's batches generated, graded and written as
they finish (resumable), summarised; the sweep's entry point (``run_evaluation``). Measures: ``metrics``; run
folders: ``run_folder``; tables, figures and exports: ``report``."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from gkv_rewards.verify import MathVerifier, warn_unverified
from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_rollout.engine import RolloutEngine
from gkv_train.config.eval_config import SETTINGS_KEYS
from gkv_train.config.options import rollout_sampling
from gkv_train.config.preflight import Generation, WeightlessModel, check_generations, check_task_contexts
from gkv_train.console import log_console_to
from gkv_train.evaluation.graded import generate_and_grade
from gkv_train.evaluation.metrics import pass_at_k, retained_by_position
from gkv_train.evaluation.report import lm_eval_results, plot_summaries, results_table, software_versions
from gkv_train.exits import refusing
from gkv_train.jsonio import dumps, read_jsonl, write_atomically
from gkv_train.models import check_adapter, check_model, load_model, model_identity
from gkv_train.problems.data import GIVEN, load_problems, local_file
from gkv_train.runs.outputs import check_output
from gkv_train.runs.run_folder import EVALUATION_LOG, LM_EVAL_RESULTS, claim_run_dir, finished_batches
from gkv_train.runs.runlock import RunLock
from gkv_train.stats import bootstrap_interval, standard_error
from gkv_train.storage import naming_full_disk


def run_budget(compression: CompressionConfig) -> int | None:
    """The budget a run stands at (its name, the results' columns): the method's (given, or its own default); for a
    compressing method that reads none (``s4r``) the one given for the sweep; None for ``full`` and otherwise."""
    if not compression.compresses:
        return None
    return getattr(compression.resolved, "budget", compression.budget)


def run_name(compression: CompressionConfig) -> str:
    budget = run_budget(compression)
    return compression.method if budget is None else f"{compression.method}-b{budget}"


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
        graded = generate_and_grade(
            engine,
            tokenizer,
            batch,
            prompts,
            SamplingConfig(**{**asdict(sampling), "seed": sampling.seed + index}),
            verify,
        )
        out = graded.out
        lines = sample_lines(index, batch["id"], graded, sampling.num_samples)
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
    summary.update(run=run_name(compression), budget=run_budget(compression), compression=compression.identity())
    warn_unverified(
        run_name(compression),
        summary["verifier_timeouts"],
        summary["verifier_errors"],
        ", check_error in samples.jsonl",
    )
    write_atomically(out_dir / "summary.json", dumps(summary, indent=2))
    return summary


def sample_lines(index: int, problem_ids: list, graded, n: int) -> list[dict]:
    """One ``samples.jsonl`` record per sample of batch ``index`` (``graded``: its rollout and grades, ``n``
    samples per problem, problem by problem)."""
    out, golds = graded.out, graded.golds
    return [
        {
            "batch": index,
            "problem_id": problem_ids[i // n],
            "sample": i % n,
            "completion": grade.text,
            "extracted": grade.answer,
            "gold": golds[i],
            "correct": grade.correct,
            "check_timed_out": grade.timed_out,
            "check_error": grade.error,
            "copied": grade.copied,
            "copied_share": grade.share,
            "score": grade.score,
            "length": int(out.completion_lengths[i]),
            "retention": out.retention[i].item(),
            "memory_share": out.memory_share[i].item(),
            "tokens_per_s": out.stats["tokens_per_s"],
            "batch_compressions": out.stats.get("compressions", 0),  # rounds in the batch, the prefill's included
        }
        for i, grade in enumerate(graded.grades)
    ]


def summarize(samples_path: Path, density_path: Path, n: int) -> dict:
    """pass@k (k = 1..n, averaged over problems), pass@1's 95% bootstrap interval and standard error over
    problems, the graded score and the share of required lines copied (``Grade``), lengths, compression rounds per
    batch, retention (all / correct samples; and by relative position, ``retained_by_position``), the cache's
    persistent memory share at the end (``RolloutOutput.memory_share``), tokens/s, answer checks, their timeouts and
    their errors (no verdict). Empty means are None (null in JSON)."""
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
        "score": mean([s["score"] for s in samples if "score" in s]),
        "copied_share": mean([s["copied_share"] for s in samples if "copied_share" in s]),
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


def run_evaluation(config, settings: dict, config_files: dict[str, str] | None = None) -> dict:
    """``scripts/evaluate.py`` / ``gkv-train evaluate``: every run of ``config`` (an ``EvalConfig``, whose
    ``settings`` as plain values go into the summaries), the files described there; returns the JSON line's
    record (also printed). Everything is checked before any work (``refusing``): the runs, model, data, the
    context and memory the rollouts need, ``output_dir`` (``check_evaluation_folder``); then ``output_dir`` is
    locked for this call
    (``RunLock``: a second evaluation into it is refused while this one runs), its run folders claimed, and
    ``config_files`` (name -> text: the resolved configuration) written under ``output_dir/hydra``."""
    out_dir = Path(config.output_dir)
    with refusing():
        runs = config.compressions()
        check_model(config.model)
        if config.adapter is not None:
            check_adapter(config.adapter, config.model)
        weightless = WeightlessModel(config.model)
        check_task_contexts(weightless, {"data": config.data})
        problems = load_problems(config.data, config.seed)
        check_evaluation_folder(config)
        prompts = [config.data.prompt_template.format(problem=p) for p in problems["problem"]]
        rows = min(config.batch_problems, len(problems)) * config.num_generations
        given = list(problems[GIVEN]) if GIVEN in problems.column_names else None
        generation = Generation(
            "evaluation", prompts, problems["id"], rows, config.max_completion_length, runs, given=given
        )
        check_generations(weightless, [generation], dtype_bytes=2 if config.precision == "bf16" else 4, device="cpu")
        out_dir.mkdir(parents=True, exist_ok=True)
        lock = RunLock.acquire(out_dir, "output_dir")
        try:
            check_evaluation_folder(config, held=True)  # again, locked: one that ended meanwhile is not written over
            for compression in runs:
                run = config.run_settings(compression)
                claim_run_dir(out_dir / run_name(compression), run, config.overwrite, SETTINGS_KEYS)
        except BaseException:
            lock.release()
            raise
    with lock:
        for name, text in (config_files or {}).items():
            (out_dir / "hydra").mkdir(exist_ok=True)
            write_atomically(out_dir / "hydra" / name, text)
        return _evaluate(config, settings, runs, problems, out_dir)


def check_evaluation_folder(config, held: bool = False) -> None:
    """``output_dir`` by the rule of every job's output (``check_output``): not in use by another evaluation,
    empty or missing, an evaluation's (each run's folder then claimed by its settings), or ``overwrite=true``; never
    a training run's folder, nor the folder of the model or adapter it evaluates. ``held``: this call holds its
    lock."""
    inputs = {"model": config.model, "adapter": config.adapter}
    check_output("evaluate", config.output_dir, "output_dir", overwrite=config.overwrite, inputs=inputs, held=held)


def _evaluate(config, settings: dict, runs: list[CompressionConfig], problems, out_dir: Path) -> dict:
    """The work of ``run_evaluation`` once everything is checked and ``out_dir`` is locked and claimed."""
    data = config.data
    log_console_to(out_dir / EVALUATION_LOG)
    for warning in config.warnings():
        print(f"warning: {warning}", file=sys.stderr)
    dtype = torch.bfloat16 if config.precision == "bf16" else torch.float32
    model, tokenizer = load_model(config.model, dtype=dtype, adapter=config.adapter)
    sampling = rollout_sampling(config, config.seed)
    batches = math.ceil(len(problems) / config.batch_problems)
    summaries = []
    with tqdm(total=batches * len(runs), unit="batch") as sweep:  # one bar over the sweep: every run's batches
        for i, compression in enumerate(runs):
            sweep.set_description(f"{run_name(compression)} (run {i + 1}/{len(runs)})")
            summaries.append(
                evaluate_compression(
                    model,
                    tokenizer,
                    problems,
                    compression,
                    sampling,
                    out_dir / run_name(compression),
                    config.batch_problems,
                    data.prompt_template,
                    progress=sweep,
                )
            )
    versions = software_versions()
    identity = {
        "model": model_identity(config.model),
        "adapter": None if config.adapter is None else model_identity(config.adapter),
    }
    data_name = data.name or local_file(data.path, None, data.split).stem
    write_atomically(
        out_dir / "summary.json",
        dumps(
            {
                "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "config": settings,
                **identity,
                "data": data.identity(),
                "versions": versions,
                "runs": summaries,
            },
            indent=2,
        ),
    )
    results = lm_eval_results(summaries, data_name, settings, versions)
    write_atomically(out_dir / LM_EVAL_RESULTS, dumps({**results, "date": time.time()}, indent=2))
    title = (
        f"{config.model}{' + ' + config.adapter if config.adapter else ''} · {data_name} · "
        f"{summaries[0]['problems']} problems x {config.num_generations} samples"
    )
    if config.plots:
        plot_summaries(summaries, out_dir, title)
    print(title + "\n" + results_table(summaries), file=sys.stderr, flush=True)
    hidden = ("retained_density", "retention_by_position", "compression")
    compact = [{k: v for k, v in s.items() if k not in hidden} for s in summaries]
    result = {"evaluation": data_name, "model": config.model, "output_dir": str(out_dir), "runs": compact}
    print(dumps(result), flush=True)
    return result


def final_evaluation(model, tokenizer, compression: CompressionConfig, sampling: SamplingConfig, problems) -> dict:
    """A training run's final evaluation (``eval.json``): accuracy on the held-out problems (``problems``, with
    their prompts) under the recipe's ``compression`` (how the model will be run), ``sampling.num_samples``
    completions each."""
    engine = RolloutEngine(model, tokenizer, compression)
    verify = MathVerifier()
    graded = generate_and_grade(engine, tokenizer, problems, list(problems["prompt"]), sampling, verify)
    out, correct = graded.out, [grade.correct for grade in graded.grades]
    verify.close()
    warn_unverified("held-out evaluation", verify.stats["timeouts"], verify.stats["errors"])
    return {
        "eval": "held_out",
        "problems": len(problems),
        "samples_per_problem": sampling.num_samples,
        "accuracy": sum(correct) / len(correct),
        "mean_completion_length": out.completion_lengths.float().mean().item(),
        "retention": out.retention.mean().item(),
        "memory_share": out.memory_share.mean().item(),
        "tokens_per_s": out.stats["tokens_per_s"],
        "compression": compression.method,
        **{"verifier_" + k: v for k, v in verify.stats.items()},
    }
