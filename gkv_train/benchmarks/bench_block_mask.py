"""What building one training step's FlexAttention block masks under a G-KV record costs, before and after they came
from the record's block summaries (``gkv_rollout.contract.eviction.block_classes``) instead of
``create_block_mask`` evaluating the mask at every query-key pair, and how a G-KV record's tiles divide into full,
partial and empty ones. One JSON line.

The record: a G-KV rollout of a model with the attention shape of Qwen2.5-1.5B (28 layers, 12 query heads, 2 KV
heads; random weights, head dim 16 to keep the CPU rollout short: the record's shape depends on the layers, heads
and lengths, not on the head dim) over ``--rows`` rows of ``--length`` tokens (a 64-token prompt), at each
``--budgets``; the shorter ``--lengths`` are that record's first tokens (a record is causal: its first T positions
are the record of the first T tokens, evictions after them made NEVER).

    python scripts/bench_block_mask.py                     # 2 x 4096 and 2 x 8192, budgets 512 and 2048
    python scripts/bench_block_mask.py --quick             # tiny sizes (a test runs it)

``after``: every layer's BlockMask for all queries (a training forward), timed over the 28 layers. ``before``:
``create_block_mask`` with the same mask function, on ``--before-layers`` layers (it evaluates the mask on the
whole [rows, 12, T, T] grid, the same work in every layer), scaled to 28 in ``before_seconds``; the measured
layers' time is kept beside it; at the ``--before-lengths`` only (its dense mask takes about 4 GB at 2 x 4096 and
16 GB at 2 x 8192). The two BlockMasks are compared tile for tile on those layers.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_rollout.contract.eviction import EvictionMasks, after_end_is_never, block_classes, block_sets
from gkv_rollout.engine import RolloutEngine
from gkv_train.argument_types import count, natural, output_file
from gkv_train.jsonio import print_json
from gkv_train.models import random_prompts
from gkv_train.provenance import origin


def shape_model(layers: int, heads: int, kv_heads: int, head_dim: int) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=256,
        hidden_size=heads * head_dim,
        intermediate_size=2 * heads * head_dim,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=32768,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


def record_of(model, rows: int, length: int, budget: int) -> torch.Tensor:
    """int32 [rows, L, Hkv, length]: the G-KV record of ``rows`` rollouts of ``length`` tokens (64-token prompts)."""
    engine = RolloutEngine(model, compression=CompressionConfig("gkv", budget=budget))
    sampling = SamplingConfig(max_new_tokens=length - 64, temperature=1.0, seed=0, stop_token_ids=())
    out = engine.generate(random_prompts([64] * rows, model.config.vocab_size), sampling)
    return out.record.evict_at


def tile_shares(masks: EvictionMasks, layers: int) -> dict:
    """Of the causal tiles (a query block at or after its key block), the share full, partial and empty, over
    layers, rows and KV heads."""
    counts = torch.zeros(3, dtype=torch.float64)
    T = masks.positions.shape[-1]
    for layer in range(layers):
        full, partial = block_classes(masks.evict_cols[:, layer], masks.positions, masks.valid, T)
        causal = torch.ones(full.shape[-2:], dtype=torch.bool).tril()
        counts += torch.tensor(
            [(full & causal).sum(), (partial & causal).sum(), (~full & ~partial & causal).sum()], dtype=torch.float64
        )
    return dict(zip(("full", "partial", "empty"), (counts / counts.sum()).tolist()))


def measure(record: torch.Tensor, length: int, heads: int, before_layers: int) -> dict:
    """The build times (after: all layers; before: ``before_layers`` layers, scaled to all, or None when
    ``before_layers`` is 0) and the tile shares of the record's first ``length`` tokens."""
    from torch.nn.attention.flex_attention import create_block_mask

    rows, layers = record.shape[0], record.shape[1]
    evict = after_end_is_never(record[..., :length], torch.full((rows,), length))
    masks = EvictionMasks.build(evict, torch.ones(rows, length, dtype=torch.long), "flex")
    start = time.perf_counter()
    built = [masks.layer_block_mask(layer, heads, length) for layer in range(layers)]
    after = time.perf_counter() - start
    start = time.perf_counter()
    reference = [
        create_block_mask(masks.layer_mask_mod(layer, heads, length), rows, heads, length, length)
        for layer in range(before_layers)
    ]
    measured = time.perf_counter() - start
    before = measured * layers / before_layers if before_layers else None
    return {
        "length": length,
        "after_seconds": after,
        "before_seconds": before,
        "before_measured_layers": before_layers,
        "before_measured_seconds": measured if before_layers else None,
        "speedup": before / after if before else None,
        "equal_to_create_block_mask": all(
            block_sets(built[i]) == block_sets(reference[i]) for i in range(before_layers)
        ),
        "tiles": tile_shares(masks, layers),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=count, default=2)
    parser.add_argument("--lengths", type=count, nargs="+", default=[4096, 8192])
    parser.add_argument("--budgets", type=count, nargs="+", default=[512, 2048])
    parser.add_argument(
        "--before-layers", type=natural, default=1, help="layers create_block_mask builds (scaled to all)"
    )
    parser.add_argument(
        "--before-lengths",
        type=count,
        nargs="*",
        help="the lengths create_block_mask runs at (default: every one; it holds a [rows, heads, T, T] mask: about "
        "4 GB at 2 x 4096, 16 GB at 2 x 8192)",
    )
    parser.add_argument("--results", type=output_file, default=Path("results/bench_block_mask.json"))
    parser.add_argument("--quick", action="store_true", help="a tiny shape and lengths (a test runs it)")
    args = parser.parse_args()
    layers, heads, kv_heads, head_dim = (28, 12, 2, 16) if not args.quick else (3, 4, 2, 8)
    if args.quick:
        args.lengths, args.budgets = [256, 384], [96]
    model = shape_model(layers, heads, kv_heads, head_dim)
    before_lengths = args.lengths if args.before_lengths is None else args.before_lengths
    found = {}
    for budget in args.budgets:
        start = time.perf_counter()
        record = record_of(model, args.rows, max(args.lengths), budget)
        rollout = time.perf_counter() - start
        found[str(budget)] = {
            "rollout_seconds": rollout,
            "points": [
                measure(record, n, heads, args.before_layers if n in before_lengths else 0)
                for n in sorted(args.lengths)
            ],
        }
    result = {
        "benchmark": "block_mask",
        "shape": {"layers": layers, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "rows": args.rows},
        "block_mask_build_seconds": {
            b: {
                str(p["length"]): {k: p[k] for k in ("before_seconds", "after_seconds", "speedup")} for p in r["points"]
            }
            for b, r in found.items()
        },
        "budgets": found,
        **origin(),
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")
    print_json(result)


if __name__ == "__main__":
    main()
