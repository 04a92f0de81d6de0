"""Teacher traces for offline distillation: full-cache completions, checked, written as JSONL."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import datasets
from tqdm import tqdm

from gkv_rewards.grading import grade_completions, required_column
from gkv_rewards.verify import MathVerifier, warn_unverified
from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_rollout.engine import RolloutEngine, stop_ids_of
from gkv_train.config.options import rollout_sampling
from gkv_train.config.preflight import Generation, WeightlessModel, check_generations, check_task_contexts
from gkv_train.evaluation.graded import generate_and_grade
from gkv_train.exits import refusing
from gkv_train.jsonio import dumps, write_atomically
from gkv_train.models import check_model, load_model
from gkv_train.problems.data import GIVEN, check_sampled_only, load_problems
from gkv_train.problems.files import read_records
from gkv_train.runs.outputs import check_output
from gkv_train.runs.runlock import RunLock
from gkv_train.storage import naming_full_disk

TRACE_FIELDS = ("id", "prompt", "completion", "completion_ids", "answer", "correct", "check_timed_out", "check_error")
SOLUTION = "solution"  # a problem set's column of the completion that solves it (count_recall's)
TRACE_BATCH = 4  # problems per generate call


def generate_traces(
    model,
    tokenizer,
    problems,
    sampling: SamplingConfig,
    prompt_template: str,
    batch_problems: int = TRACE_BATCH,
    keep_incorrect: bool = False,
    verify: MathVerifier | None = None,
) -> list[dict]:
    """Sample ``sampling.num_samples`` full-cache completions per problem and check them with ``verify`` (default:
    a new ``MathVerifier``; pass one to read its ``stats`` afterwards). Checks that gave no verdict (timed out, or
    their worker died twice) are named on stderr.

    Returns rows with ``TRACE_FIELDS`` (``completion_ids`` include the stop token; ``check_timed_out`` /
    ``check_error``: the check gave no verdict, so ``correct`` is false without the answer being wrong), the
    correct ones only unless ``keep_incorrect``.
    """
    engine = RolloutEngine(model, tokenizer, CompressionConfig("full"))
    verify = MathVerifier() if verify is None else verify
    before = dict(verify.stats)
    rows = []
    for start in tqdm(range(0, len(problems), batch_problems), desc="teacher traces", unit="batch"):
        batch = problems.select(range(start, min(start + batch_problems, len(problems))))
        prompts = [prompt_template.format(problem=p) for p in batch["problem"]]
        graded = generate_and_grade(
            engine, tokenizer, batch, prompts, replace(sampling, seed=sampling.seed + start), verify
        )
        golds, completions = graded.golds, graded.out.completions()
        for i, (ids, grade) in enumerate(zip(completions, graded.grades)):
            row = i // sampling.num_samples
            if grade.correct or keep_incorrect:
                rows.append(
                    {
                        "id": batch["id"][row],
                        "prompt": prompts[row],
                        "completion": grade.text,
                        "completion_ids": ids,
                        "answer": golds[i],
                        "correct": grade.correct,
                        "check_timed_out": grade.timed_out,
                        "check_error": grade.error,
                    }
                )
    verify.close()
    marked = ", check_error in the traces" if keep_incorrect else ", left out of the traces"
    warn_unverified(
        "teacher traces",
        verify.stats["timeouts"] - before["timeouts"],
        verify.stats["errors"] - before["errors"],
        marked,
    )
    return rows


def check_solutions(problems) -> None:
    """ValueError unless ``problems`` have a ``solution`` column (what ``source=solution`` writes as traces)."""
    if SOLUTION not in problems.column_names:
        raise ValueError(
            f"traces source=solution reads the problems' {SOLUTION!r} column, which they do not have (a built-in "
            "task that has one: count_recall); with source=model the teacher's own completions are the traces"
        )


def solution_traces(tokenizer, problems, prompt_template: str, stop_id: int, verify: MathVerifier) -> list[dict]:
    """The problems' own solutions as traces (``source=solution``): each completion is the problem's given
    beginning (its ``continuation``, when it has one) and its ``solution`` column, tokenised as the rollout engine
    feeds them (the given text on its own, ``RolloutEngine.generate(prefixes=...)``; the solution after it) and
    ended by ``stop_id``; ``given``: the number of given tokens, which distillation puts no loss on. Each is graded
    as an evaluation grades a completion; ValueError naming the first problem whose solution fails its own check
    (a task whose solutions are wrong teaches the wrong skill)."""
    check_solutions(problems)
    given = problems[GIVEN] if GIVEN in problems.column_names else [""] * len(problems)
    prefixes = [tokenizer(text, add_special_tokens=False)["input_ids"] if text else [] for text in given]
    completions = [
        prefix + tokenizer(solution, add_special_tokens=False)["input_ids"] + [stop_id]
        for prefix, solution in zip(prefixes, problems[SOLUTION])
    ]
    grades = grade_completions(tokenizer, completions, problems["answer"], verify, required_column(problems, 1))
    rows = []
    for problem, prefix, ids, grade in zip(problems, prefixes, completions, grades):
        if not grade.correct:
            raise ValueError(f"problem {problem['id']}'s solution does not pass its own check: {grade.text[-200:]!r}")
        prompt = prompt_template.format(problem=problem["problem"])
        fields = (problem["id"], prompt, grade.text, ids, problem["answer"], True, False, False)
        rows.append({**dict(zip(TRACE_FIELDS, fields)), "given": len(prefix)})
    return rows


def write_traces(rows: list[dict], path: Path) -> None:
    """Write ``rows`` as JSONL to ``path`` atomically (a reader never sees part of it; a full disk is named)."""
    path, text = Path(path), "".join(json.dumps(row) + "\n" for row in rows)
    with naming_full_disk(path, "the traces file", needed=len(text.encode())):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, text)


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
    for i, row in enumerate(rows):
        given = row.get("given", 0)
        if isinstance(given, bool) or not isinstance(given, int) or not 0 <= given < len(row["completion_ids"]):
            raise ValueError(
                f"traces file {path} record {i + 1}: given={given!r} must be a whole number of given completion "
                f"tokens below the completion's {len(row['completion_ids'])}"
            )
    return datasets.Dataset.from_list(rows)


def check_traces_output(config, held: bool = False) -> None:
    """``output`` by the rule of every job's output (``check_output``): not in use by another call, a new file, or
    an existing one with ``overwrite=true`` (a call generates every trace again); never in a training run's folder,
    nor in the model's. ``held``: this call holds its lock."""
    inputs = {"model": config.model}
    check_output("traces", config.output, "output", overwrite=config.overwrite, inputs=inputs, held=held)


def run_traces(config) -> dict:
    """``scripts/generate_traces.py`` / ``gkv-train traces``: the traces of ``config`` (a ``TracesConfig``)
    written to ``config.output``; returns the JSON line's record (also printed; with the answer checks' counts,
    timeouts and errors). The model, data, output path and the context and memory the generation needs are
    checked before any work (``refusing``; the output by ``check_traces_output``); then the output is locked for this
    call (``RunLock.acquire_file``: a second call writing the same file is refused while this one runs)."""
    output = Path(config.output)
    with refusing():
        check_model(config.model)
        weightless = WeightlessModel(config.model)
        check_task_contexts(weightless, {"data": config.data})
        problems = load_problems(config.data, config.seed)
        if config.source == "model":
            check_sampled_only(problems, "data", "teacher traces")
        else:
            check_solutions(problems)
        check_traces_output(config)
        prompts = [config.data.prompt_template.format(problem=p) for p in problems["problem"]]
        rows = min(TRACE_BATCH, len(problems)) * config.num_generations
        generation = Generation(
            "teacher traces", prompts, problems["id"], rows, config.max_completion_length, [CompressionConfig("full")]
        )
        check_generations(weightless, [generation], dtype_bytes=4, device="cpu")
        output.parent.mkdir(parents=True, exist_ok=True)
        lock = RunLock.acquire_file(output, "output")
        try:
            check_traces_output(config, held=True)  # again, locked: a call that ended meanwhile is not written over
        except BaseException:
            lock.release()
            raise
    with lock:
        model, tokenizer = load_model(config.model)
        verify = MathVerifier()
        if config.source == "solution":
            stop_id = stop_ids_of(model, tokenizer, rollout_sampling(config, config.seed))[0]
            rows = solution_traces(tokenizer, problems, config.data.prompt_template, stop_id, verify)
            verify.close()
        else:
            rows = generate_traces(
                model,
                tokenizer,
                problems,
                rollout_sampling(config, config.seed),
                config.data.prompt_template,
                keep_incorrect=config.keep_incorrect,
                verify=verify,
            )
        write_traces(rows, output)
    result = {
        "traces": config.output,
        "problems": len(problems),
        "samples": len(problems) * (config.num_generations if config.source == "model" else 1),
        "written": len(rows),
        "correct": sum(r["correct"] for r in rows),
        **{"verifier_" + k: v for k, v in verify.stats.items()},
    }
    print(dumps(result), flush=True)
    return result
