"""Training sees what inference saw, at reasoning length: for every eviction method and S4R, a rollout of
``--new-tokens`` tokens and the trainer's log-probs under its record with each mask backend (``sdpa``: a dense
boolean mask per layer; ``flex``: FlexAttention's block masks, on the CPU too), fp32, with the two controls that
must fail (a plain causal mask; the records rotated by one layer), and what the no-grad forward under the record
cost (seconds; memory it added at its peak). Each cell is ``gkv-train check`` (``scripts/check_consistency.py``)
in a process of its own (so that no cell's memory figure reuses pages another cell freed); one JSON line, and with
``--results`` the file ``scripts/render_docs.py`` renders.

    python scripts/bench_consistency_length.py --results results/bench_consistency_length.json   # tiny model
    python scripts/bench_consistency_length.py --new-tokens 24 --methods gkv s4r                  # seconds
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from gkv_rollout.registry import eviction_methods
from gkv_train.argument_types import count, natural, output_file
from gkv_train.evidence.regime import COMMAND
from gkv_train.jsonio import dumps, print_json, write_atomically
from gkv_train.provenance import origin, provenance

TOL = 1e-4  # the invariant: fp32 log-probs under the record equal the rollout's
CONTROL = 1e-2  # a control that does not differ by more than this has not failed
KEEP = (
    "max_abs_logprob_diff",
    "mean_abs_logprob_diff",
    "causal_mask_diff",
    "rotated_layers_diff",
    "compressions",
    "new_tokens",
    "retention",
    "forward_seconds",
    "forward_memory_bytes",
)


def cell(method: str, backend: str, args) -> dict:
    """One method under one backend: ``check``'s figures, whether it holds and whether both controls fail."""
    argv = ["--model", args.model, "--batch", str(args.batch), "--max-new-tokens", str(args.new_tokens)]
    argv += ["--method", method, "--backend", backend, "--seed", str(args.seed)]
    if method != "s4r":  # S4R's memory is its eta, not a budget
        argv += ["--budget", str(args.budget), "--window", str(args.window), "--interval", str(args.interval)]
    start = time.perf_counter()
    found = subprocess.run(
        [*COMMAND, "check", *argv],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    report = json.loads(found.stdout.strip().splitlines()[-1])
    rotated = report["rotated_layers_diff"]  # None: the same record in every layer, which rotating cannot change
    controls = min(report["causal_mask_diff"], CONTROL * 2 if rotated is None else rotated)
    return {
        "method": method,
        "backend": backend,
        **{k: report[k] for k in KEEP},
        "consistent": report["max_abs_logprob_diff"] <= TOL,
        "controls_fail": controls > CONTROL,
        "seconds": round(time.perf_counter() - start, 1),
    }


def rotated(diff: float | None) -> str:
    return "- (the same in every layer)" if diff is None else f"{diff:.2f}"


def cost(value: float | None, unit: float, form: str) -> str:
    """A cost in ``unit``s, or "-" where it was not measured (a run before the report had it)."""
    return "-" if value is None else format(value / unit, form)


def tables(view: str, result: dict) -> str:
    """``rows``: per method and backend, the largest |diff| against the bound, both controls, rounds, retention,
    and what the no-grad forward under the record cost (seconds, memory it added at its peak; "-" in rows measured
    before the check reported it)."""
    if view != "rows":
        raise SystemExit(f"error: bench_consistency_length has the view rows, not {view!r}")
    lines = [
        f"| method | backend | max \\|diff\\| (bound {TOL:g}) | mean \\|diff\\| | causal control | rotated control | "
        "holds, controls fail | compression rounds | retention | no-grad forward s | its memory MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        verdict = "yes" if r["consistent"] and r["controls_fail"] else "**no**"
        lines.append(
            f"| {r['method']} | {r['backend']} | {r['max_abs_logprob_diff']:.1e} | {r['mean_abs_logprob_diff']:.1e} | "
            f"{r['causal_mask_diff']:.2f} | {rotated(r['rotated_layers_diff'])} | {verdict} | {r['compressions']} | "
            f"{r['retention']:.3f} | {cost(r.get('forward_seconds'), 1, '.2f')} | "
            f"{cost(r.get('forward_memory_bytes'), 2**20, '.0f')} |"
        )
    return "\n".join(lines) + f"\n\n{provenance(result)}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="as gkv-train check takes it (tiny: random weights)")
    parser.add_argument("--batch", type=count, default=2)
    parser.add_argument("--new-tokens", type=count, default=2048)
    methods = [*eviction_methods(), "s4r"]
    parser.add_argument("--methods", nargs="+", default=methods, choices=methods)
    parser.add_argument("--backends", nargs="+", default=["sdpa", "flex"], choices=["sdpa", "flex"])
    parser.add_argument("--budget", type=count, default=256, help="the eviction methods' budget")
    parser.add_argument("--window", type=count, default=16)
    parser.add_argument("--interval", type=count, default=64)
    parser.add_argument("--seed", type=natural, default=0)
    parser.add_argument(
        "--results", type=output_file, help="also write the JSON line here (e.g. results/bench_consistency_length.json)"
    )
    args = parser.parse_args()
    rows = []
    for method in args.methods:
        for backend in args.backends:
            rows.append(cell(method, backend, args))
            print(f"[consistency_length] {dumps(rows[-1])}", file=sys.stderr, flush=True)
    result = {
        "benchmark": "consistency_length",
        "model": args.model,
        "batch": args.batch,
        "new_tokens": args.new_tokens,
        "budget": args.budget,
        "window": args.window,
        "interval": args.interval,
        "rows": rows,
        "all_hold": all(r["consistent"] and r["controls_fail"] for r in rows),
        **origin(),
    }
    if args.results:
        write_atomically(args.results, dumps(result) + "\n")
    print_json(result)


if __name__ == "__main__":
    main()
