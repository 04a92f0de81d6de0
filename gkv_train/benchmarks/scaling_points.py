"""The points of ``bench_scaling``: one rollout of a method at a length (in a process of its own, its memory its
own), one training step of a trainer at a length (``bench_train_step`` in a child whose peak memory ``os.wait4``
reports), a point's key and setting, and the marginal decode time between lengths."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

METHODS = ("full", "gkv", "s4r")


def log(message: str) -> None:
    print(f"[scaling {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rollout_point(args) -> dict:
    """One rollout (``--point rollout METHOD LENGTH``), in this process."""
    import torch

    from gkv_rollout.config import CompressionConfig, SamplingConfig
    from gkv_rollout.engine import RolloutEngine, encode_prompts
    from gkv_train.models import load_model, random_prompts
    from gkv_train.problems.data import gsm8k_questions

    method, length = args.point[1], int(args.point[2])
    model, tokenizer = load_model(args.model)
    if args.model == "tiny":
        prompts = random_prompts([40 + i for i in range(args.batch)])
    else:
        prompts = encode_prompts(tokenizer, gsm8k_questions(args.batch))
    loaded = peak_rss_bytes()
    compression = {
        "full": CompressionConfig("full"),
        "gkv": CompressionConfig("gkv", budget=args.budget),
        "s4r": CompressionConfig.of("s4r", eta=args.eta),
    }[method]
    sampling = SamplingConfig(max_new_tokens=length, temperature=0.6, top_p=0.95, seed=0, ignore_eos=True)
    out = RolloutEngine(model, tokenizer, compression).generate(prompts, sampling)
    s = out.stats
    return {
        "kind": "rollout",
        "method": method,
        "length": length,
        "batch": args.batch,
        "threads": torch.get_num_threads(),
        "tokens_per_s": s["tokens_per_s"],
        "seconds": s["seconds"],
        "prefill_seconds": s["prefill_seconds"],
        "decode_seconds": s["decode_seconds"],
        "decode_seconds_per_token": s["decode_seconds"] / length,
        "compress_share_of_decode": s["compress_seconds"] / s["decode_seconds"] if s["decode_seconds"] else None,
        "compress_phase_share_of_decode": {
            phase: seconds / s["decode_seconds"] for phase, seconds in s["compress_phase_seconds"].items()
        }
        if s["decode_seconds"]
        else None,
        "kv_cache_peak_bytes": s["kv_cache_bytes"],
        "memory_share": out.memory_share.mean().item(),
        "peak_rss_bytes": peak_rss_bytes(),
        "peak_rss_above_model_bytes": peak_rss_bytes() - loaded,
    }


def point_key(point: dict) -> tuple:
    """What a point measured: (kind, method or trainer, length, training settings: ``training_setting``)."""
    if point["kind"] == "rollout":
        return ("rollout", point["method"], point["length"], None)
    return ("training", point["trainer"], point["length"], training_setting(point))


def training_point(trainer: str, length: int, args) -> dict:
    """One ``bench_train_step.py`` step of ``trainer`` at ``length`` new tokens, in a child process whose own
    peak resident memory ``os.wait4`` reports."""
    command = [
        sys.executable,
        "-m",
        "gkv_train.benchmarks.bench_train_step",
        "--model",
        args.model,
        "--max-new-tokens",
        str(length),
        "--budget",
        str(args.budget),
        "--steps",
        "1",
        "--warmup",
        "0",
        "--trainers",
        trainer,
        "--rows",
        str(args.train_rows),
        *(["--gradient-checkpointing"] if args.gradient_checkpointing else []),
    ]
    env = dict(os.environ)
    if args.mmap_threshold is not None:
        env["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    stdout = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"error: bench_train_step.py {trainer} at {length} tokens failed ({proc.returncode})")
    step = json.loads(stdout.strip().splitlines()[-1])["trainers"][trainer]
    return {
        "kind": "training",
        "trainer": trainer,
        "length": length,
        "rows": args.train_rows,
        "gradient_checkpointing": args.gradient_checkpointing,
        "mmap_threshold": args.mmap_threshold,
        "step": step,
        "seconds": step["total"],
        "peak_rss_bytes": usage.ru_maxrss * 1024,
    }


def run_rollout_point(method: str, length: int, args) -> dict:
    command = [
        sys.executable,
        "-m",
        "gkv_train.benchmarks.bench_scaling",
        "--point",
        "rollout",
        method,
        str(length),
        "--model",
        args.model,
        "--batch",
        str(args.batch),
        "--budget",
        str(args.budget),
        "--eta",
        str(args.eta),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"error: rollout {method} at {length} tokens failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def with_marginals(points: list[dict]) -> None:
    """Each rollout point's marginal decode time per token: (decode time here - at the previous length) /
    (length here - previous length), per method."""
    for method in METHODS:
        rows = sorted(
            (p for p in points if p["kind"] == "rollout" and p["method"] == method), key=lambda p: p["length"]
        )
        for before, here in zip(rows, rows[1:]):
            here["marginal_decode_seconds_per_token"] = (here["decode_seconds"] - before["decode_seconds"]) / (
                here["length"] - before["length"]
            )


def training_setting(point: dict) -> tuple[int, bool, int | None]:
    """A training point's rows, activation checkpointing and glibc mmap threshold (a point of an earlier version,
    without them: 8, no, None: glibc's dynamic threshold)."""
    return point.get("rows", 8), point.get("gradient_checkpointing", False), point.get("mmap_threshold")
