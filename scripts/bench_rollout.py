"""Rollout throughput on SmolLM2: engine ``full`` and compressed methods against stock HF ``generate``, one
JSON line (tokens/s, compression share of decode time, peak KV cache, record size, retention).

Batch 16, the first 16 GSM8K test questions (chat template), forced length (EOS blocked), T 0.6, top-p 0.95;
budget 128, interval 32, every other setting the method's default.

    python scripts/bench_rollout.py                      # gkv; 1024 new tokens, about 10 minutes on 2 cores
    python scripts/bench_rollout.py --max-new-tokens 256
    python scripts/bench_rollout.py --methods streaming snapkv rkv h2o gkv --skip-hf   # every method
    python scripts/bench_rollout.py --max-new-tokens 512 --compile-decode   # also compiled decode steps

With --compile-decode every engine run is repeated with ``compile_decode``: a first (cold) rollout that compiles
and a second (warm) one that reuses the graphs; ``compile_seconds`` is cold minus warm time, and
``tokens_per_s_with_compile`` counts the compile in one rollout.

With --long-recall SENTENCES the rollout is ``long_recall``'s instead (``--batch`` test problems, their stories of
SENTENCES middle sentences given as prefixes, then the answer sampled: T 0.6, top-p 0.95, up to 32 tokens past the
longest story, the model's EOS), each method timed feeding the stories one token per forward (``tokens``:
``SamplingConfig.chunk_given=false``, the loop before given tokens were chunked) and up to each compression point
per forward (``chunks``, the default): seconds for the story part (``given_seconds``: until the longest story's
last token has been through the model) and the whole, and their ratios::

    python scripts/bench_rollout.py --long-recall 80 --batch 8 --budget 128 --window 8 --interval 16
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from gkv_rollout.config import CompressionConfig, SamplingConfig, add_compression_args, compression_from_args
from gkv_rollout.engine import encode_prompts
from gkv_train.argument_types import count, natural
from gkv_train.config.options import check_compile_decode
from gkv_train.models import load_model
from gkv_train.problems.data import PROMPT_TEMPLATE
from gkv_train.problems.tasks import LONG_RECALL_SENTENCES, long_recall_task

from _common import gsm8k_questions, print_json
from _rollout_timing import compiled_run, engine_run, hf_generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch", type=count, default=16)
    parser.add_argument("--max-new-tokens", type=count, default=1024)
    parser.add_argument("--seed", type=natural, default=0)
    parser.add_argument("--skip-hf", action="store_true", help="do not time HF generate")
    parser.add_argument("--methods", nargs="+", default=None, help="compressed methods to time (default: --method)")
    parser.add_argument("--compile-decode", action="store_true", help="also time compiled decode steps")
    parser.add_argument(
        "--long-recall",
        type=count,
        metavar="SENTENCES",
        help="time long_recall rollouts (stories of SENTENCES middle sentences, 80: ~1,000 tokens) instead",
    )
    add_compression_args(parser, method="gkv", budget=128, interval=32)
    args = parser.parse_args()
    if args.long_recall is not None and not 1 <= args.long_recall <= LONG_RECALL_SENTENCES:
        parser.error(f"--long-recall must be 1-{LONG_RECALL_SENTENCES} sentences, got {args.long_recall}")
    if args.long_recall is not None and args.compile_decode:
        parser.error("--long-recall times eager rollouts: without --compile-decode")
    try:
        methods = compression_from_args(args, args.methods) if args.methods else [compression_from_args(args)]
    except ValueError as err:
        parser.error(str(err))
    if args.compile_decode:
        check_compile_decode(True, methods, key="--compile-decode")

    model, tokenizer = load_model(args.model)
    if args.long_recall is not None:
        print_json(long_recall(args, methods, model, tokenizer))
        return
    prompts = encode_prompts(tokenizer, gsm8k_questions(args.batch))
    sampling = SamplingConfig(
        max_new_tokens=args.max_new_tokens, temperature=0.6, top_p=0.95, seed=args.seed, ignore_eos=True
    )
    result = {
        "benchmark": "rollout",
        "model": args.model,
        "batch": args.batch,
        "max_new_tokens": args.max_new_tokens,
        "threads": torch.get_num_threads(),
        "compression": {c.method: c.identity() for c in methods},
    }
    for c in [CompressionConfig("full"), *methods]:
        result["engine_" + c.method] = engine_run(model, tokenizer, prompts, sampling, c)
        if args.compile_decode:
            result[f"engine_{c.method}_compiled"] = compiled_run(model, tokenizer, prompts, sampling, c)
    if not args.skip_hf:
        result["hf_generate"] = hf_generate(model, tokenizer, prompts, sampling)
        hf = result["hf_generate"]["tokens_per_s"]
        result["speedup_full_vs_hf"] = result["engine_full"]["tokens_per_s"] / hf
        for c in methods:
            result[f"speedup_{c.method}_vs_hf"] = result["engine_" + c.method]["tokens_per_s"] / hf
        for name in [n for n in result if n.endswith("_compiled")]:
            result[f"speedup_{name[len('engine_') :]}_vs_hf"] = result[name]["tokens_per_s"] / hf
    print_json(result)


def long_recall(args, methods: list[CompressionConfig], model, tokenizer) -> dict:
    """--long-recall: each method's long_recall rollout with the stories fed one token per forward and in chunks."""
    problems = long_recall_task(args.batch, "test", args.seed, args.long_recall)
    prompts = encode_prompts(tokenizer, [PROMPT_TEMPLATE.format(problem=p) for p in problems["problem"]])
    stories = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in problems["continuation"]]
    longest = max(map(len, stories))
    sampling = SamplingConfig(max_new_tokens=longest + 32, temperature=0.6, top_p=0.95, seed=args.seed)
    result = {
        "benchmark": "rollout_long_recall",
        "model": args.model,
        "batch": args.batch,
        "sentences": args.long_recall,
        "story_tokens": {"min": min(map(len, stories)), "max": longest},
        "max_new_tokens": sampling.max_new_tokens,
        "threads": torch.get_num_threads(),
        "compression": {c.method: c.identity() for c in methods},
    }
    for c in methods:
        runs = {
            feed: engine_run(
                model, tokenizer, prompts, dataclasses.replace(sampling, chunk_given=feed == "chunks"), c, stories
            )
            for feed in ("tokens", "chunks")
        }
        result[c.method] = {
            **runs,
            "story_speedup": runs["tokens"]["given_seconds"] / runs["chunks"]["given_seconds"],
            "whole_speedup": runs["tokens"]["seconds"] / runs["chunks"]["seconds"],
        }
    return result


if __name__ == "__main__":
    main()
