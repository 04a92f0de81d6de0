"""One compression of the rollout cache, per method, at SmolLM2's shapes: milliseconds per compression; one
JSON line.

The cache holds ``budget + interval`` occupied slots of random keys (each KV head's keys share a direction, so
that the redundancy term finds near-duplicates), values and window queries, as at a decode-time compression;
``EvictionCache.compress`` is timed on a fresh fill each repeat (median and minimum; and the median of each
phase: ``score``, the method's scores of every layer, and ``evict``, selecting and moving the kept slots).
Divided by ``interval`` decode steps, it is the compression share of decode that ``bench_rollout.py`` measures
inside a rollout, without the rollout.

    python scripts/bench_compress.py                                  # every eviction method, batch 16
    python scripts/bench_compress.py --methods gkv rkv --batch 8 --repeats 20
    python scripts/bench_compress.py --methods gkv --similarity mean_cosine   # any CompressionConfig option
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch

from gkv_rollout.config import CompressionConfig, add_compression_args, compression_from_args
from gkv_rollout.contract.eviction import NEVER
from gkv_rollout.eviction_cache import EvictionCache
from gkv_rollout.registry import eviction_methods
from gkv_train.argument_types import count
from gkv_train.jsonio import print_json
from gkv_train.provenance import git_commit, machine


def time_compression(
    shape: SimpleNamespace, compression: CompressionConfig, batch: int, repeats: int
) -> tuple[list[float], dict[str, list[float]]]:
    """Seconds of ``repeats`` compressions of a cache holding budget + interval tokens per sequence, and of each
    compression's phases (``EvictionCache.phase_seconds``: score, evict)."""
    method = compression.resolved
    slots, start = method.budget + method.interval, 1000  # logical positions start..start+slots-1
    cache = EvictionCache(shape, method, batch, slots, start + slots, torch.float32, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    seconds, phases = [], {}
    for _ in range(repeats):
        for layer in range(shape.num_hidden_layers):
            direction = torch.randn(batch, shape.num_key_value_heads, 1, shape.head_dim, generator=g)
            cache.keys[layer].copy_(direction + torch.randn(cache.keys[layer].shape, generator=g))
            cache.values[layer].normal_(generator=g)
            cache.queries[layer].normal_(generator=g)
        cache.valid.fill_(True)
        cache.lengths.fill_(start + slots)
        cache.used = slots
        cache.positions.copy_(torch.arange(start, start + slots))
        cache.history.fill_(float("nan"))
        cache.evict_at.fill_(NEVER)
        cache.query_pos.copy_(torch.arange(start + slots - method.window, start + slots))
        cache.query_ok.fill_(True)
        before = cache.phase_seconds
        begin = time.perf_counter()
        cache.compress()
        seconds.append(time.perf_counter() - begin)
        for phase, total in cache.phase_seconds.items():
            phases.setdefault(phase, []).append(total - before[phase])
        if cache.used != method.budget or not bool(cache.evict_at.eq(start + slots).any()):
            raise RuntimeError(f"{compression.method}: the compression did not evict down to the budget")
    return seconds, phases


def tables(view: str, records: list[dict]) -> str:
    """``scripts/render_docs.py``'s view ``latest`` of ``results/bench_compress.jsonl`` (one line per run): the
    runs of the file's last date, one row per code version (``code``: the commit measured), each method's
    median milliseconds per compression as the range over that version's runs."""
    if view != "latest":
        raise SystemExit(f"error: bench_compress has the view latest, not {view!r}")
    date = records[-1]["date"]
    runs = [r for r in records if r["date"] == date]
    codes = list(dict.fromkeys(r["code"] for r in runs))
    methods = list(runs[0]["ms_per_compression"])
    lines = ["| ms per compression | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for code in codes:
        mine = [r for r in runs if r["code"] == code]
        cells = []
        for m in methods:
            low, high = (round(f(r["ms_per_compression"][m]["median"] for r in mine)) for f in (min, max))
            cells.append(f"{low}" if low == high else f"{low}-{high}")
        lines.append(f"| {code} ({len(mine)} runs) | " + " | ".join(cells) + " |")
    first = runs[0]
    return "\n".join(lines) + (
        f"\n\n`python scripts/bench_compress.py` — {date}, batch {first['batch']}, {first['slots']} "
        f"occupied slots, {first['layers']} layers x {first['kv_heads']} KV heads x "
        f"{first['head_dim']}, threads {first['threads']}; runs of the versions alternated\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=eviction_methods())
    parser.add_argument("--batch", type=count, default=16)
    parser.add_argument("--repeats", type=count, default=10)
    parser.add_argument("--layers", type=count, default=30, help="default: SmolLM2-135M's shapes")
    parser.add_argument("--heads", type=count, default=9)
    parser.add_argument("--kv-heads", type=count, default=3)
    parser.add_argument("--head-dim", type=count, default=64)
    add_compression_args(parser, method="gkv", budget=128, interval=32)
    args = parser.parse_args()
    try:
        runs = compression_from_args(args, args.methods)
    except ValueError as err:
        parser.error(str(err))
    shape = SimpleNamespace(
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        hidden_size=args.heads * args.head_dim,
    )
    result = {
        "benchmark": "compress",
        "batch": args.batch,
        "slots": args.budget + args.interval,
        "layers": args.layers,
        "heads": args.heads,
        "kv_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "threads": torch.get_num_threads(),
        "compression": {},
        "ms_per_compression": {},
        "code": git_commit(),
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
    }
    for method, config in zip(args.methods, runs):
        seconds, phases = time_compression(shape, config, args.batch, args.repeats)
        result["compression"][method] = config.identity()
        result["ms_per_compression"][method] = {
            "median": round(statistics.median(seconds) * 1e3, 1),
            "min": round(min(seconds) * 1e3, 1),
            **{f"{phase}_median": round(statistics.median(s) * 1e3, 1) for phase, s in phases.items()},
        }
    print_json(result)


if __name__ == "__main__":
    main()
