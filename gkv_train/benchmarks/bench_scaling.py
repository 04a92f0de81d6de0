"""Cost against the work, on CPU: how rollout and training cost grow with the generation length; one JSON line
and a plot.

* ``rollout``: the engine with ``full``, ``gkv`` (budget ``--budget``) and ``s4r`` (``--eta``) on SmolLM2 at a
  fixed batch of GSM8K prompts, every completion forced to the length (EOS blocked), for each length of
  ``--lengths``: tokens/s, mean decode time per token, the marginal decode time per token (between this length
  and the previous one: what one more token costs at that length), the KV cache's peak bytes, and the process's
  peak resident memory above what the loaded model held.
* ``training``: one step of ``rl_sparse`` and ``rl_full`` per length of ``--train-lengths``
  (``scripts/bench_train_step.py``: 1 prompt x ``--train-rows`` samples, 8 by default, every completion forced to
  the length; gkv at ``--budget`` under rl_sparse; with ``--gradient-checkpointing`` each layer recomputed in the
  backward): the step's time by phase and the process's peak resident memory. A training point records its rows,
  checkpointing and ``--mmap-threshold``, and a rerun with others measures new points beside it.

Peak resident memory on Linux counts what glibc's heap keeps after tensors are freed: its mmap threshold grows
with the blocks freed (up to 32 MiB), and blocks below it come from a heap that fragments. ``--mmap-threshold
BYTES`` runs the training steps with ``MALLOC_MMAP_THRESHOLD_=BYTES`` (a fixed threshold: larger blocks are
mapped and returned on free), so that the peak follows the live tensors.

Each point runs in its own process (peak memory is per process) and is appended to ``points.jsonl`` under
``--output-root`` as it finishes: a rerun skips the points done. Writes ``scaling.png`` there too, and with
``--results FILE`` the JSON line (with date, commit, machine and command) to FILE; ``scripts/render_docs.py``
makes docs/benchmarks/scaling.md's tables from it (``tables``).

    python scripts/bench_scaling.py                        # SmolLM2-135M, about 45 minutes on one core
    python scripts/bench_scaling.py --quick                # tiny model and lengths (a test runs a part)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gkv_train.argument_types import count, natural, output_file, output_folder, positive_fraction
from gkv_train.benchmarks.scaling_points import (
    METHODS,
    log,
    point_key,
    rollout_point,
    run_rollout_point,
    training_point,
    training_setting,
    with_marginals,
)
from gkv_train.jsonio import dumps, print_json, read_jsonl, write_atomically
from gkv_train.provenance import origin, provenance

TRAINERS = ("rl_sparse", "rl_full")


def plot(points: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    from gkv_train.evaluation.report import method_style

    colours = {m: method_style(m)["color"] for m in METHODS} | {
        "rl_sparse": method_style("gkv")["color"],
        "rl_full": "black",
    }
    for method in METHODS:
        rows = sorted(
            (p for p in points if p["kind"] == "rollout" and p["method"] == method), key=lambda p: p["length"]
        )
        if not rows:
            continue
        x = [p["length"] for p in rows]
        axes[0].plot(
            x,
            [p["decode_seconds_per_token"] * 1e3 for p in rows],
            marker="o",
            color=colours[method],
            label=f"{method} (mean)",
        )
        marginal = [
            (p["length"], p["marginal_decode_seconds_per_token"] * 1e3)
            for p in rows
            if "marginal_decode_seconds_per_token" in p
        ]
        if marginal:
            axes[0].plot(
                *zip(*marginal), marker="x", linestyle="--", color=colours[method], label=f"{method} (marginal)"
            )
        axes[1].plot(
            x,
            [p["kv_cache_peak_bytes"] / 2**20 for p in rows],
            marker="o",
            color=colours[method],
            label=f"{method} KV cache",
        )
        axes[1].plot(
            x,
            [p["peak_rss_above_model_bytes"] / 2**20 for p in rows],
            marker="x",
            linestyle=":",
            color=colours[method],
            label=f"{method} peak RSS above the model",
        )
    for trainer in TRAINERS:
        rows = sorted(
            (p for p in points if p["kind"] == "training" and p["trainer"] == trainer), key=lambda p: p["length"]
        )
        if rows:
            axes[2].plot(
                [p["length"] for p in rows],
                [p["seconds"] for p in rows],
                marker="o",
                color=colours[trainer],
                label=trainer,
            )
    axes[0].set_ylabel("decode ms per token (batch)")
    axes[1].set_ylabel("MiB")
    axes[2].set_ylabel("seconds per training step (1 x 8 rows)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("new tokens")
        if ax.get_legend_handles_labels()[0]:  # the training panel is empty in a rollouts-only run
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_arguments() -> argparse.Namespace:
    """The command line (``--quick``: tiny values for the options left at their defaults)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch", type=count, default=4, help="rollout batch")
    parser.add_argument("--lengths", nargs="+", type=count, default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--train-lengths", nargs="+", type=count, default=[128, 256, 512, 1024])
    parser.add_argument("--methods", nargs="*", default=list(METHODS), choices=METHODS, help="none: training only")
    parser.add_argument("--trainers", nargs="*", default=list(TRAINERS), choices=TRAINERS, help="none: rollouts only")
    parser.add_argument("--budget", type=count, default=512, help="gkv budget (rollout and rl_sparse)")
    parser.add_argument(
        "--eta", type=positive_fraction, default=0.2, help="s4r persistent-memory share at each length's end"
    )
    parser.add_argument("--output-root", type=output_folder, default=Path("outputs/scaling"))
    parser.add_argument(
        "--results", type=output_file, help="also write the JSON line here (e.g. results/bench_scaling.json)"
    )
    parser.add_argument("--quick", action="store_true", help="tiny model, lengths and budget (a test runs it)")
    parser.add_argument("--train-rows", type=count, default=8, help="training: samples of the one prompt per step")
    parser.add_argument(
        "--gradient-checkpointing", action="store_true", help="training: recompute each layer in the backward"
    )
    parser.add_argument(
        "--mmap-threshold",
        type=natural,
        help="training: run each step with MALLOC_MMAP_THRESHOLD_ set to this many bytes (glibc: a fixed threshold, "
        "so that the peak resident memory follows the live tensors; default: glibc's dynamic one)",
    )
    parser.add_argument("--point", nargs=3, help=argparse.SUPPRESS)  # rollout METHOD LENGTH, in this process
    args = parser.parse_args()
    if args.mmap_threshold is not None and not 0 < args.mmap_threshold <= 32 * 2**20:
        parser.error(f"--mmap-threshold {args.mmap_threshold}: 1 to 33554432 bytes (glibc ignores larger values)")
    if args.quick:  # tiny values for the options left at their defaults
        quick = {"model": "tiny", "batch": 2, "lengths": [16, 32], "train_lengths": [8, 16], "budget": 24}
        for key, value in quick.items():
            if getattr(args, key) == parser.get_default(key):
                setattr(args, key, value)
    return args


def main() -> None:
    args = parse_arguments()
    if args.point:
        print_json(rollout_point(args))
        return
    args.output_root.mkdir(parents=True, exist_ok=True)
    store = args.output_root / "points.jsonl"
    points = read_jsonl(store) if store.is_file() else []
    settings = {"model": args.model, "batch": args.batch, "budget": args.budget, "eta": args.eta}
    points = [p for p in points if p.get("settings") == settings]  # points of other settings do not count
    done = {point_key(p) for p in points}
    start = time.perf_counter()
    training = (args.train_rows, args.gradient_checkpointing, args.mmap_threshold)
    todo = [("rollout", m, n, None) for m in args.methods for n in args.lengths] + [
        ("training", t, n, training) for n in args.train_lengths for t in args.trainers
    ]  # training length by length: the trainers of one length run one after the other, close in time (similar load)
    for kind, name, length, _ in todo:
        if (kind, name, length, training if kind == "training" else None) in done:
            continue
        log(f"{kind} {name} {length}")
        point = run_rollout_point(name, length, args) if kind == "rollout" else training_point(name, length, args)
        point["settings"] = settings
        points.append(point)
        with open(store, "a") as f:
            f.write(dumps(point) + "\n")
    points = [p for p in points if point_key(p) in set(todo)]
    with_marginals(points)
    plot(
        points,
        args.output_root / "scaling.png",
        f"{args.model}, rollout batch {args.batch} (gkv budget {args.budget}, s4r eta {args.eta}); training 1 x "
        f"{args.train_rows} rows"
        + (", activation checkpointing" if args.gradient_checkpointing else "")
        + (f", mmap threshold {args.mmap_threshold} B" if args.mmap_threshold is not None else ""),
    )
    result = {
        "benchmark": "scaling",
        **settings,
        "lengths": args.lengths,
        "train_lengths": args.train_lengths,
        "train_rows": args.train_rows,
        "gradient_checkpointing": args.gradient_checkpointing,
        "mmap_threshold": args.mmap_threshold,
        "seconds": round(time.perf_counter() - start, 1),
        "points": points,
        "plot": str(args.output_root / "scaling.png"),
        **origin(),
    }
    if args.results:
        write_atomically(args.results, dumps(result) + "\n")
    print_json(result)


def phase_shares(point: dict) -> str:
    """The decode-time phases of a rollout point as shares of decode, " (score 12%, reconstruct 21%, ...)", where
    the method has several (S4R's, its attention one of them, where the full cache's counts as model time; an
    eviction method's score and evict). S4R's ``fit`` runs in the prefill: the share column counts it, these parts
    do not."""
    phases = point.get("compress_phase_share_of_decode") or {}
    if len(phases) < 2:
        return ""
    shown = [f"{phase} {share:.0%}" for phase, share in phases.items() if phase != "fit" and share >= 0.005]
    return " (" + ", ".join(shown) + ")"


def tables(view: str, result: dict) -> str:
    """Markdown of a results line: ``rollout`` (per method and length) or ``training`` (per trainer and length),
    with where it came from."""
    mib = 2**20
    if view == "rollout":
        rows = [
            "| method | new tokens | tokens/s | decode ms/token (mean) | marginal ms/token | KV cache MiB "
            "| peak RSS above the model, MiB | memory share | compression share of decode |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for p in sorted(
            (p for p in result["points"] if p["kind"] == "rollout"),
            key=lambda p: (METHODS.index(p["method"]), p["length"]),
        ):
            marginal = p.get("marginal_decode_seconds_per_token")
            rows.append(
                f"| {p['method']} | {p['length']} | {p['tokens_per_s']:.1f} | "
                f"{p['decode_seconds_per_token'] * 1e3:.0f} "
                f"| {'-' if marginal is None else f'{marginal * 1e3:.0f}'} | {p['kv_cache_peak_bytes'] / mib:.0f} "
                f"| {p['peak_rss_above_model_bytes'] / mib:.0f} | {p['memory_share']:.2f} "
                f"| {p['compress_share_of_decode'] or 0:.1%}{phase_shares(p)} |"
            )
    else:
        rows = [
            "| trainer | new tokens | rows | checkpointing | mmap threshold | step s | generation s "
            "| log-prob forward s | backward s | peak RSS MiB | peak / rl_full's | step / rl_full's |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        training = [p for p in result["points"] if p["kind"] == "training"]
        full = {(training_setting(p), p["length"]): p for p in training if p["trainer"] == "rl_full"}
        for p in sorted(training, key=lambda p: (TRAINERS.index(p["trainer"]), training_setting(p), p["length"])):
            (n_rows, checkpointing, threshold), step = training_setting(p), p["step"]
            other = full.get((training_setting(p), p["length"]))
            ratios = (
                f"{p['peak_rss_bytes'] / other['peak_rss_bytes']:.2f} | {p['seconds'] / other['seconds']:.2f}"
                if other is not None and p["trainer"] != "rl_full"
                else "- | -"
            )
            heap = "glibc dynamic" if threshold is None else f"{threshold} B"
            rows.append(
                f"| {p['trainer']} | {p['length']} | {n_rows} | {'yes' if checkpointing else 'no'} | {heap} | "
                f"{p['seconds']:.1f} | {step['generation']:.1f} | {step['logprob_forward']:.1f} | "
                f"{step['backward']:.1f} | {p['peak_rss_bytes'] / mib:.0f} | {ratios} |"
            )
        slopes = memory_slopes(training)
        if slopes:
            rows.append("")
            rows.append(
                "Peak memory per new token (least squares over the lengths, per row of the step): "
                + "; ".join(f"{name}: {slope / mib:.2f} MiB" for name, slope in slopes.items())
                + "."
            )
    return "\n".join(rows) + f"\n\n{provenance(result)}\n"


def memory_slopes(points: list[dict]) -> dict[str, float]:
    """Per trainer and training setting with at least two lengths: the least-squares slope of the peak resident
    memory against the length, divided by the rows of the step (bytes per new token and row)."""
    groups: dict[str, list[tuple[int, int]]] = {}
    for p in points:
        rows, checkpointing, threshold = training_setting(p)
        name = f"{p['trainer']}, {rows} rows{', checkpointing' if checkpointing else ''}" + (
            f", mmap threshold {threshold} B" if threshold is not None else ""
        )
        groups.setdefault(name, []).append((p["length"], p["peak_rss_bytes"] / rows))
    found = {}
    for name, xy in groups.items():
        if len({x for x, _ in xy}) < 2:
            continue
        mx, my = sum(x for x, _ in xy) / len(xy), sum(y for _, y in xy) / len(xy)
        found[name] = sum((x - mx) * (y - my) for x, y in xy) / sum((x - mx) ** 2 for x, _ in xy)
    return found


if __name__ == "__main__":
    main()
