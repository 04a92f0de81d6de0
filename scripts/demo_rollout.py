"""Compressed-cache generation on the embedded default model: a few GSM8K questions, ``full`` vs ``gkv``.

Prints each completion, the token retention (cache length / sequence length) and tokens/s.
"""

from __future__ import annotations

import argparse

from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_rollout.engine import RolloutEngine
from gkv_train.models import load_model

from _common import gsm8k_questions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=192)
    args = parser.parse_args()

    model, tokenizer = load_model(args.model)
    questions = gsm8k_questions(args.questions)
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=0.6, top_p=0.95, seed=0)
    for compression in (CompressionConfig("full"), CompressionConfig("gkv", budget=96, window=16, interval=32)):
        out = RolloutEngine(model, tokenizer, compression).generate(questions, sampling)
        print(f"\n===== {compression.method} (budget {compression.budget if compression.compresses else 'all'}) =====")
        for i, question in enumerate(questions):
            text = tokenizer.decode(out.completions()[i], skip_special_tokens=True)
            print(f"\n[{i}] Q: {question}\n    A: {text.strip()}")
            print(f"    tokens {int(out.completion_lengths[i])}, retention {out.retention[i]:.2f}")
        s = out.stats
        print(
            f"\n{compression.method}: {s['tokens_per_s']:.1f} tokens/s, {s['compressions']} compressions, "
            f"mean retention {out.retention.mean():.2f}"
        )


if __name__ == "__main__":
    main()
