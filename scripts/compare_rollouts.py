"""Behaviour unchanged across a refactor: rollouts of every method (tiny-llama; tokens, log-probs, record tensors)
dumped under one tree and compared bit for bit with another's.

    PYTHONPATH=$OLD:$OLD/rollout:$OLD/rewards python scripts/compare_rollouts.py --dump before.pt   # the old tree
    python scripts/compare_rollouts.py --dump after.pt                                            # this tree
    python scripts/compare_rollouts.py --compare before.pt after.pt   # one JSON line; exit 1 unless all identical

The configurations are built with ``CompressionConfig.of`` (flat option names), which every layout of the options
takes.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

CASES = {
    "full": ("full", {}),
    "streaming": ("streaming", dict(budget=24, window=4, interval=8)),
    "snapkv": ("snapkv", dict(budget=24, window=4, interval=8)),
    "rkv": ("rkv", dict(budget=24, window=4, interval=8)),
    "gkv": ("gkv", dict(budget=24, window=4, interval=8)),
    "gkv-mean": ("gkv", dict(budget=24, window=4, interval=8, form="mean", alpha=0.5)),
    "gkv-sum-nored": ("gkv", dict(budget=24, window=4, interval=8, form="sum", redundancy=False)),
    "gkv-cos": ("gkv", dict(budget=24, window=4, interval=8, similarity="mean_cosine")),
    "h2o": ("h2o", dict(budget=24, interval=8)),
    "tova": ("tova", dict(budget=24)),
    "random": ("random", dict(budget=24, window=4, interval=8)),
    "s4r": ("s4r", dict(eta=0.3)),
    "s4r-rank": ("s4r", dict(rank=4, rank_v=6, full_layers=[0])),
    "s4r-refresh": ("s4r", dict(eta=0.3, refresh=8)),
}
PROMPTS = ["a short prompt", "a much longer prompt with many more words in it to be compressed early", "x y z w"]


def dump(path: str) -> None:
    from gkv_rollout.config import CompressionConfig, SamplingConfig
    from gkv_rollout.engine import RolloutEngine
    from gkv_train.models import load_model

    model, tokenizer = load_model("tiny")
    found = {}
    for name, (method, options) in CASES.items():
        engine = RolloutEngine(model, tokenizer, CompressionConfig.of(method, **options))
        out = engine.generate(PROMPTS, SamplingConfig(max_new_tokens=40, temperature=1.0, num_samples=2, seed=3))
        record = {} if out.record is None else {k: v.clone() for k, v in out.record.to_batch().items()}
        found[name] = {"sequences": out.sequences, "logprobs": out.logprobs, "record": record}
    torch.save(found, path)


def compare(before: str, after: str) -> dict:
    a, b = torch.load(before), torch.load(after)
    verdict = {}
    for name in CASES:
        x, y = a.get(name), b.get(name)
        same = (
            x is not None
            and y is not None
            and torch.equal(x["sequences"], y["sequences"])
            and torch.equal(x["logprobs"], y["logprobs"])
            and x["record"].keys() == y["record"].keys()
            and all(torch.equal(x["record"][k], y["record"][k]) for k in x["record"])
        )
        verdict[name] = "identical" if same else "different"
    return verdict


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dump", metavar="FILE")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.dump:
        dump(args.dump)
        return 0
    if args.compare:
        verdict = compare(*args.compare)
        print(json.dumps({"rollouts": verdict, "identical": all(v == "identical" for v in verdict.values())}))
        return 0 if all(v == "identical" for v in verdict.values()) else 1
    parser.error("give --dump FILE or --compare BEFORE AFTER")


if __name__ == "__main__":
    sys.exit(main())
