"""Random Attention (``random_attention``) against its authors' code, on the same inputs.

The authors' code: SalesforceAIResearch/Random-Attention at 066c520, ``kvcompress/engine/cache_utils.py``,
``EvictLayer.post_attention_update`` and ``_run_eviction`` in eviction mode ``random_pp``, as the paper's cells run it
(``scripts/run_cell.sh``: ``--token_budget K --residual_length 64``). The repository could not be brought onto this
machine (no snapshot of it is stored here); its code was read, and its eviction step is restated below as
``reference_kept``, its rule and not its code, for one (sequence, layer, KV head):

* the prompt is prefilled whole; nothing is evicted at the prefill;
* after the forward of a generated token, when the cache holds ``cur > budget`` tokens and ``cur`` is a multiple of
  ``residual`` (64), it is cut to ``budget``: the last ``residual`` slots are kept; of the slots before them (the
  candidates) the first ``pl = min(prompt, K - 1)`` (``K = budget - residual``) score ``+inf`` and the others one
  ``torch.rand`` draw each, per (row, KV head, slot), afresh at every layer and eviction; the ``K`` best are kept,
  compacted in time order.

Three checks, of the project's real rollout (``RolloutEngine.replay`` on tiny-llama, 4 layers x 2 KV heads, random
token ids teacher-forced; its record read back as kept sets: key k is kept by the compression stamped s iff
k < s and evict_at[k] > s):

1. ``law``: the project's kept sets against the reference rule fed the same uniform draws (the project's
   ``hashed_uniform`` of each candidate; the rule takes any independent uniform draws) and evicting at the
   project's steps: the share of (compression, layer, KV head) kept sets that are equal;
2. ``cadence``: the reference at its own steps (the cache's length a multiple of ``residual``) against the
   project's (every ``interval`` generated tokens), same draws: each side's steps, and the kept sets equal where
   the steps coincide (prompts whose length is a multiple of 64);
3. ``distribution``: with the authors' generator (``torch.rand``) on the reference side and the project's own
   draws over many rows and seeds on the other, each side alone: the prompt always kept, ``budget`` kept, every
   candidate equally likely (a chi-square test of each position's keep count against the uniform rate
   (budget - window - prompt) / candidates at every compression: its p-value over all of them), and the mean
   overlap of two KV heads' (and two layers') kept sets at the first compression against an independent draw's.

``--method random`` is the control: the same checks of ``random`` (no prompt kept) must disagree.

    python scripts/compare_random_attention.py --results results/compare_random_attention.json
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_rollout.contract.eviction import NEVER
from gkv_rollout.engine import RolloutEngine
from gkv_rollout.scoring import hashed_uniform
from gkv_train.jsonio import dumps, write_atomically
from gkv_train.models import tiny_model
from gkv_train.provenance import origin

from _common import print_json, random_prompts

AUTHORS = "SalesforceAIResearch/Random-Attention@066c520 kvcompress/engine/cache_utils.py random_pp"
Draw = Callable[[int, torch.Tensor], torch.Tensor]  # (time, positions int64 [n]) -> uniform float32 [n]


def reference_kept(prompt: int, forwarded: int, budget: int, residual: int, interval: int, draw: Draw, cadence: str):
    """The authors' rule for one (row, layer, KV head) over ``forwarded`` generated tokens: {stamp: bool [stamp],
    the positions kept by the eviction after which ``stamp`` tokens were seen}. ``cadence``: ``theirs`` (evict when
    the cache's length exceeds ``budget`` and is a multiple of ``residual``) or ``project`` (every ``interval``
    generated tokens, once the sequence exceeds ``budget``)."""
    slots = list(range(prompt))  # the positions the cache holds, in time order
    K = budget - residual
    kept = {}
    for generated in range(1, forwarded + 1):
        slots.append(prompt + generated - 1)
        cur, length = len(slots), prompt + generated
        if cadence == "theirs":
            due = cur > budget and cur % residual == 0
        else:
            due = generated % interval == 0 and length > budget
        if not due:
            continue
        candidates = torch.tensor(slots[: cur - residual])
        protected = min(prompt, K - 1)
        score = draw(length, candidates).clone()
        score[:protected] = float("inf")
        best = score.topk(K).indices.sort().values
        slots = candidates[best].tolist() + slots[cur - residual :]
        mask = torch.zeros(length, dtype=torch.bool)
        mask[slots] = True
        kept[length] = mask
    return kept


def project_kept(evict_at: torch.Tensor) -> dict[int, torch.Tensor]:
    """One row's record evict_at int32 [L, Hkv, T] -> {stamp s: bool [L, Hkv, s], the keys kept by the compression
    stamped s}, one per compression that evicted something."""
    stamps = evict_at[evict_at < NEVER].unique().tolist()
    return {s: evict_at[..., :s] > s for s in stamps}


def project_rollout(model, method: str, prompts: list[int], completion: int, args, seed: int):
    """(replayed RolloutOutput, completion tokens forwarded) of ``method`` at the settings of ``args`` on random
    token ids: prompts of the given lengths, completions of ``completion`` tokens (the last is never forwarded)."""
    cfg = CompressionConfig(method, budget=args.budget, window=args.window, interval=args.interval)
    engine = RolloutEngine(model, compression=cfg)
    ids = random_prompts(prompts, seed=seed)
    completions = random_prompts([completion] * len(prompts), seed=seed + 1)
    return engine.replay(ids, completions, SamplingConfig(temperature=1.0, seed=seed)), completion - 1


def shared_draw(seed: int, row: int, head: int) -> Draw:
    """The project's uniform draw of (row, layer x KV heads + head) as the reference's draw: the same numbers."""
    return lambda time, positions: hashed_uniform(
        seed, torch.tensor(row), torch.tensor(time), torch.tensor(head), positions
    )


def compare_sets(ours: dict, theirs: list[dict]) -> tuple[int, int, bool]:
    """(kept sets equal, kept sets compared, same stamps) of one row: ``ours`` {stamp: bool [L, Hkv, s]},
    ``theirs`` one {stamp: bool [s]} per (layer, KV head), flattened layer-major."""
    same = [sorted(ours) == sorted(t) for t in theirs]
    equal = total = 0
    for index, mine in enumerate(theirs):
        for stamp, mask in mine.items():
            total += 1
            found = ours.get(stamp)
            equal += int(found is not None and torch.equal(found.flatten(0, 1)[index], mask))
    return equal, total, all(same)


def law_and_cadence(model, args) -> dict:
    """Checks 1 and 2 on the prompts ``args.prompts``."""
    out, forwarded = project_rollout(model, args.method, args.prompts, args.completion, args, args.seed)
    L, Hkv = out.record.evict_at.shape[1:3]
    law = {"equal": 0, "compared": 0}
    rows = []
    for row, prompt in enumerate(args.prompts):
        ours = project_kept(out.record.evict_at[row])
        found = {}
        for cadence in ("project", "theirs"):
            found[cadence] = [
                reference_kept(
                    prompt,
                    forwarded,
                    args.budget,
                    args.window,
                    args.interval,
                    shared_draw(args.seed, row, layer * Hkv + head),
                    cadence,
                )
                for layer in range(L)
                for head in range(Hkv)
            ]
        equal, compared, same_steps = compare_sets(ours, found["project"])
        law["equal"] += equal
        law["compared"] += compared
        equal_theirs, compared_theirs, steps_theirs = compare_sets(ours, found["theirs"])
        rows.append(
            {
                "prompt": prompt,
                "project_steps": sorted(ours),
                "reference_steps": sorted(found["theirs"][0]),
                "same_steps": steps_theirs,
                "equal": equal_theirs,
                "compared": compared_theirs,
                "law_same_steps": same_steps,
            }
        )
    law["agreement"] = law["equal"] / max(law["compared"], 1)
    return {"law": law, "cadence": rows}


def chi_square_p(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square with ``dof`` degrees of freedom."""
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(statistic / 2.0)))


def law_statistics(samples: list[list[torch.Tensor]], prompt: int, budget: int, window: int) -> dict:
    """Each side's law from its kept sets: ``samples``, per (row, layer, KV head), the bool masks [stamp] of its
    compressions in order (the same steps for all). The prompt kept in every one, ``budget`` kept, and each
    compression's keep counts by position against the uniform rate over the candidates (the occupied positions
    from ``prompt`` to ``stamp - window``): the chi-square statistic summed over compressions, its degrees of
    freedom and p-value."""
    prompt_kept = all(bool(m[:prompt].all()) for sample in samples for m in sample)
    budget_kept = all(int(m.sum()) == budget for sample in samples for m in sample)
    statistic, dof = 0.0, 0
    for c in range(len(samples[0])):
        stamp = samples[0][c].shape[0]
        expected, variance, kept = torch.zeros(stamp), torch.zeros(stamp), torch.zeros(stamp)
        for sample in samples:
            held = torch.ones(stamp, dtype=torch.bool)
            if c:
                held[: samples[0][c - 1].shape[0]] = sample[c - 1]  # kept before, and every token since
            candidates = held.clone()
            candidates[:prompt] = False
            candidates[stamp - window :] = False
            rate = (budget - window - prompt) / max(int(candidates.sum()), 1)
            expected += candidates * rate
            variance += candidates * rate * (1 - rate)
            kept += candidates & sample[c]
        seen = variance > 0
        statistic += float(((kept[seen] - expected[seen]) ** 2 / variance[seen]).sum())
        dof += int(seen.sum()) - 1
    return {
        "prompt_always_kept": prompt_kept,
        "budget_always_kept": budget_kept,
        "chi_square": round(statistic, 1),
        "dof": dof,
        "p_uniform": round(chi_square_p(statistic, dof), 4),
    }


def first_overlaps(samples: list[list[torch.Tensor]], pairs: list[tuple[int, int]], prompt: int, window: int):
    """The mean number of candidates two draws both keep at the first compression, over the (sample, sample)
    index ``pairs`` (two KV heads, or two layers, of one row)."""
    shared = []
    for a, b in pairs:
        first_a, first_b = samples[a][0], samples[b][0]
        stamp = first_a.shape[0]
        shared.append(int((first_a & first_b)[prompt : stamp - window].sum()))
    return sum(shared) / len(shared)


def distribution(model, args) -> dict:
    """Check 3: the project over ``args.rows`` rows x ``args.seeds`` seeds, the reference with ``torch.rand`` over as
    many (row, layer, KV head) draws, one prompt length (``args.prompt``)."""
    L, Hkv = model.config.num_hidden_layers, model.config.num_key_value_heads
    ours, theirs = [], []
    generator = torch.Generator().manual_seed(args.seed)
    for seed in range(args.seeds):
        out, forwarded = project_rollout(
            model, args.method, [args.prompt] * args.rows, args.completion, args, args.seed + 100 * seed
        )
        for row in range(args.rows):
            kept = project_kept(out.record.evict_at[row])
            ours += [[kept[s][layer, head] for s in sorted(kept)] for layer in range(L) for head in range(Hkv)]
            for _ in range(L * Hkv):
                draw = lambda time, positions: torch.rand(len(positions), generator=generator)  # noqa: E731
                found = reference_kept(args.prompt, forwarded, args.budget, args.window, args.interval, draw, "project")
                theirs.append([found[s] for s in sorted(found)])
    # sample index = (seed x rows + row) x L x Hkv + layer x Hkv + head
    groups = range(0, len(ours), L * Hkv)
    heads = [(g + layer * Hkv, g + layer * Hkv + 1) for g in groups for layer in range(L)]
    layers = [(g + head, g + Hkv + head) for g in groups for head in range(Hkv)]
    stamp = ours[0][0].shape[0]
    candidates = stamp - args.window - args.prompt
    kept = args.budget - args.window - args.prompt
    result = {"samples": len(ours), "compressions": len(ours[0]), "independent_overlap": kept**2 / candidates}
    for side, samples in (("project", ours), ("reference", theirs)):
        result[side] = law_statistics(samples, args.prompt, args.budget, args.window)
        result[side]["overlap_heads"] = round(first_overlaps(samples, heads, args.prompt, args.window), 2)
        result[side]["overlap_layers"] = round(first_overlaps(samples, layers, args.prompt, args.window), 2)
    return result


def tables(view: str, result: dict) -> str:
    """``scripts/render_docs.py``'s view ``agreement`` of ``results/compare_random_attention.json``: the law's
    agreement, each prompt's steps on both sides, the distribution checks."""
    if view != "agreement":
        raise SystemExit(f"error: compare_random_attention has the view agreement, not {view!r}")
    law = result["law"]
    lines = [
        "| check | project | authors' rule |",
        "|---|---|---|",
        f"| kept sets equal, same draws, the project's steps | {law['equal']} of {law['compared']} "
        f"({law['agreement']:.3f}) | - |",
    ]
    for row in result["cadence"]:
        steps = "the same" if row["same_steps"] else "others"
        lines.append(
            f"| prompt of {row['prompt']}: tokens seen at the first compression, compressions; kept sets equal, "
            f"each side at its own steps ({steps}) | {row['project_steps'][0]}, {len(row['project_steps'])} | "
            f"{row['reference_steps'][0]}, {len(row['reference_steps'])}; {row['equal']} of {row['compared']} |"
        )
    dist = result["distribution"]
    ours, theirs = dist["project"], dist["reference"]
    lines += [
        f"| prompt always kept, `budget` always kept ({dist['samples']} draws x {dist['compressions']} compressions) "
        f"| {ours['prompt_always_kept']}, {ours['budget_always_kept']} | {theirs['prompt_always_kept']}, "
        f"{theirs['budget_always_kept']} |",
        f"| every candidate equally likely: chi-square (dof), p | {ours['chi_square']} ({ours['dof']}), "
        f"{ours['p_uniform']} | {theirs['chi_square']} ({theirs['dof']}), {theirs['p_uniform']} |",
        f"| candidates two KV heads / two layers both keep at the first compression (independent: "
        f"{dist['independent_overlap']:.2f}) | {ours['overlap_heads']} / {ours['overlap_layers']} | "
        f"{theirs['overlap_heads']} / {theirs['overlap_layers']} |",
    ]
    s = result["settings"]
    return "\n".join(lines) + (
        f"\n\n`{result['command']}` — {result['date']}, commit {result['commit']}, {result['machine']}; "
        f"`{s['method']}` on {s['model']}, budget {s['budget']}, window {s['window']}, interval {s['interval']}, "
        f"prompts {s['prompts']} (distribution: {s['prompt']}), {s['completion']}-token completions; the authors' "
        f"rule as {AUTHORS} states it\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", default="random_attention", help="the project's method (random: the control)")
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument("--window", type=int, default=64, help="the authors' residual_length")
    parser.add_argument("--interval", type=int, default=64)
    parser.add_argument("--prompts", type=int, nargs="+", default=[64, 128, 37, 100])
    parser.add_argument("--completion", type=int, default=768, help="tokens per completion")
    parser.add_argument("--prompt", type=int, default=64, help="the distribution check's prompt length")
    parser.add_argument("--rows", type=int, default=32, help="the distribution check's rows per seed")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results", help="also write the JSON here (e.g. results/compare_random_attention.json)")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    model = tiny_model("tiny-llama")
    result = {
        "script": "compare_random_attention",
        "authors": AUTHORS,
        "settings": {
            "method": args.method,
            "model": "tiny-llama",
            "budget": args.budget,
            "window": args.window,
            "interval": args.interval,
            "prompts": args.prompts,
            "completion": args.completion,
            "prompt": args.prompt,
            "rows": args.rows,
            "seeds": args.seeds,
            "seed": args.seed,
        },
        **law_and_cadence(model, args),
        "distribution": distribution(model, args),
        **origin(),
    }
    if args.results:
        write_atomically(args.results, dumps(result, indent=2) + "\n")
    print_json(result)


if __name__ == "__main__":
    main()
