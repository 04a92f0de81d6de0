"""Roll out with a compressed cache, recompute the log-probs as the trainer does, print one JSON line.

    python scripts/check_consistency.py --model tiny --method gkv
    python scripts/check_consistency.py --model smollm2-135m --method rkv --budget 64 --window 8 --interval 16
    python scripts/check_consistency.py --model smollm2-135m --method gkv --precision bf16

``--precision bf16`` runs as training does (``precision=bf16``): fp32 weights, rollout and trainer forwards under
bf16 autocast.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
from _common import gsm8k_questions, print_json, random_prompts

from gkv_train.consistency import consistency_report
from gkv_train.models import load_model
from rollout.config import SamplingConfig, add_compression_args, compression_from_args
from rollout.engine import RolloutEngine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="tiny, tiny-qwen2, tiny-qwen3, smollm2-135m, HF name or path")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    add_compression_args(parser, method="gkv", budget=32, window=8, interval=16)
    args = parser.parse_args()
    compression = compression_from_args(args)

    model, tokenizer = load_model(args.model)
    if args.model.startswith("tiny"):
        prompts = random_prompts([7 + 11 * i for i in range(args.batch)], model.config.vocab_size, args.seed)
    else:
        prompts = gsm8k_questions(args.batch)
    sampling = SamplingConfig(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed, ignore_eos=True
    )
    device = next(model.parameters()).device.type
    with torch.autocast(device, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
        out = RolloutEngine(model, tokenizer, compression).generate(prompts, sampling)
        report = consistency_report(model, out, args.temperature)
    print_json(
        {
            "method": compression.method,
            "model": args.model,
            "precision": args.precision,
            **report,
            "consistent": report["max_abs_logprob_diff"] <= 1e-4,
            "compressions": out.stats["compressions"],
            "batch": out.sequences.shape[0],
            "prompt_lengths": out.prompt_lengths.tolist(),
            "new_tokens": out.stats["new_tokens"],
            "retention": round(out.retention.mean().item(), 4),
            "config": dataclasses.asdict(compression.resolved()),
        }
    )


if __name__ == "__main__":
    main()
