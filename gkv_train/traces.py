"""Teacher traces for offline distillation: full-cache completions, checked, written as JSONL."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import datasets
from tqdm import tqdm

from gkv_train.data import load_problems, read_records
from gkv_train.exits import refusing
from gkv_train.jsonio import dumps, write_atomically
from gkv_train.models import check_model, load_model
from gkv_train.preflight import Generation, check_generations
from gkv_train.rewards.grading import grade_completions
from gkv_train.rewards.verify import MathVerifier
from gkv_train.rollout.config import CompressionConfig, SamplingConfig
from gkv_train.rollout.engine import RolloutEngine
from gkv_train.storage import check_output_file, naming_full_disk

TRACE_FIELDS = ("id", "prompt", "completion", "completion_ids", "answer", "correct")
TRACE_BATCH = 4  # problems per generate call


def generate_traces(
    model, tokenizer, problems, sampling: SamplingConfig, prompt_template: str, batch_problems: int = TRACE_BATCH,
    keep_incorrect: bool = False,
) -> list[dict]:
    """Sample ``sampling.num_samples`` full-cache completions per problem and check them.

    Returns rows with ``TRACE_FIELDS`` (``completion_ids`` include the stop token), the correct ones only unless
    ``keep_incorrect``.
    """
    engine = RolloutEngine(model, tokenizer, CompressionConfig("full"))
    verify = MathVerifier()
    rows = []
    for start in tqdm(range(0, len(problems), batch_problems), desc="teacher traces", unit="batch"):
        batch = problems.select(range(start, min(start + batch_problems, len(problems))))
        prompts = [prompt_template.format(problem=p) for p in batch["problem"]]
        out = engine.generate(prompts, replace(sampling, seed=sampling.seed + start))
        completions = out.completions()
        golds = [gold for gold in batch["answer"] for _ in range(sampling.num_samples)]
        for i, (ids, grade) in enumerate(zip(completions, grade_completions(tokenizer, completions, golds, verify))):
            row = i // sampling.num_samples
            if grade.correct or keep_incorrect:
                rows.append({
                    "id": batch["id"][row], "prompt": prompts[row], "completion": grade.text, "completion_ids": ids,
                    "answer": golds[i], "correct": grade.correct,
                })
    verify.close()
    return rows


def write_traces(rows: list[dict], path: Path) -> None:
    """Write ``rows`` as JSONL to ``path`` atomically (a reader never sees part of it; a full disk is named)."""
    path = Path(path)
    with naming_full_disk(path, "the traces"):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, "".join(json.dumps(row) + "\n" for row in rows))


def load_traces(path: str) -> datasets.Dataset:
    """Traces JSONL -> Dataset; a clear error for a missing file or missing fields."""
    if Path(path).is_dir():
        raise IsADirectoryError(f"traces file {path} is a folder, not a file")
    if not Path(path).is_file():
        raise FileNotFoundError(f"traces file {path} does not exist (write one with scripts/generate_traces.py)")
    rows = [row for _, row in read_records(Path(path))]  # names the file and line of a bad record
    missing = [f for f in ("prompt", "completion_ids") if f not in rows[0]]
    if missing:
        raise ValueError(f"traces file {path} lacks the fields {missing}")
    return datasets.Dataset.from_list(rows)


def run_traces(config) -> dict:
    """``scripts/generate_traces.py`` / ``gkv-train traces``: the traces of ``config`` (a ``TracesConfig``)
    written to ``config.output``; returns the JSON line's record (also printed). The model, data, output path and
    the context and memory the generation needs are checked before any work (``refusing``)."""
    with refusing():
        check_model(config.model)
        problems = load_problems(config.data, config.seed)
        check_output_file(Path(config.output), "output")
        prompts = [config.data.prompt_template.format(problem=p) for p in problems["problem"]]
        rows = min(TRACE_BATCH, len(problems)) * config.num_generations
        generation = Generation("teacher traces", prompts, problems["id"], rows, config.max_new_tokens,
                                [CompressionConfig("full")])  # fmt: skip
        check_generations(config.model, [generation], dtype_bytes=4, device="cpu")
    model, tokenizer = load_model(config.model)
    sampling = SamplingConfig(
        max_new_tokens=config.max_new_tokens, temperature=config.temperature, top_p=config.top_p,
        num_samples=config.num_generations, seed=config.seed, compile_decode=config.compile_decode,
    )
    rows = generate_traces(
        model, tokenizer, problems, sampling, config.data.prompt_template, keep_incorrect=config.keep_incorrect
    )
    write_traces(rows, Path(config.output))
    result = {"traces": config.output, "problems": len(problems), "samples": len(problems) * config.num_generations,
              "written": len(rows), "correct": sum(r["correct"] for r in rows)}  # fmt: skip
    print(dumps(result), flush=True)
    return result

