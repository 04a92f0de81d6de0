"""S4R on SmolLM2: prefill and decode cost, persistent memory, and passkey retrieval; one JSON line.

    python scripts/bench_s4r.py                    # ~4k-token prompts, 128 new tokens, eta 0.2, 20 passkey cases
    python scripts/bench_s4r.py --cases 4 --context 2000
    python scripts/bench_s4r.py --cases 0                       # timing and memory only
    python scripts/bench_s4r.py --memory-share --context 146 --new-tokens 1024   # eta's two meanings
    python scripts/bench_s4r.py --refresh 128 --context 146 --new-tokens 1024    # bases that follow the generation
    python scripts/bench_s4r.py --basis-cost 2048 4096                           # the whole-prompt basis's prefill

* prefill: S4R (sampling + SVD + projection) against plain prefill of the same ~4k-token prompt;
* decode time per token over 128 forced tokens: ``full``, ``s4r`` and a low-rank baseline that reconstructs
  every token each step (``rho=1``);
* persistent cache bytes of S4R against the full cache at the prompt length;
* ``--memory-share`` (alone): the persistent-memory share S4R reaches at the end of a long generation with the
  rank solved at the prompt's length (``expected_length=0``, the paper's setting) and at the end of the
  generation (the default), against the ``eta`` asked;
* ``--refresh N`` (alone): along one generation of ``--new-tokens`` (sampled with the full cache, then replayed
  through S4R with and without ``refresh=N``), the relative reconstruction error ||x - x B_r B_r^T|| / ||x|| of
  every generated token's pre-RoPE key and value (per layer, with the rank it was stored with), by 128-token
  stretch; and the per-token decode time of full, s4r and s4r with refresh, forced to the same length, in one
  run (Llama-style models: the states are read at ``k_proj`` / ``v_proj``);
* ``--basis-cost N ...`` (alone): at each prompt length N, the prefill of the full cache, of S4R with the paper's
  sampled bases and with ``basis=prompt`` (the SVD of every non-sink prompt token): the prefill's seconds and
  S4R's own share of them (sampling, SVD, projection: the cache's ``compress_seconds``), median of ``--repeats``;
* passkey retrieval: a 5-digit number hidden at a random depth in ~4k tokens of filler, greedy answer,
  accuracy for ``full``, ``s4r`` (eta), and ``streaming`` / ``gkv`` with a budget of the same memory
  (eta x prompt length).
"""

from __future__ import annotations

import argparse
import json
import random
import re

import torch

from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_rollout.engine import RolloutEngine
from gkv_train.argument_types import count, natural, positive_fraction
from gkv_train.jsonio import print_json
from gkv_train.models import load_model
from gkv_train.problems.data import DATA_DIR
from gkv_train.provenance import origin, provenance

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


def long_prompt(tokenizer, context: int) -> str:
    """About ``context`` tokens of MATH-500 problems, one after another."""
    parts, size = [], 0
    with open(DATA_DIR / "math500_test.jsonl") as f:
        for line in f:
            text = json.loads(line)["problem"] + "\n\n"
            size += len(tokenizer(text, add_special_tokens=False)["input_ids"])
            parts.append(text)
            if size >= context:
                break
    return "".join(parts) + "Which of these problems is the hardest? Answer:"


def passkey_case(tokenizer, context: int, rng: random.Random) -> tuple[str, str]:
    """A passkey prompt of about ``context`` tokens with the key at a random depth, and the key."""
    key = str(rng.randint(10000, 99999))
    per_filler = len(tokenizer(FILLER, add_special_tokens=False)["input_ids"])
    n = max(1, context // per_filler)
    depth = rng.randint(0, n)
    needle = f"The pass key is {key}. Remember it. {key} is the pass key. "
    text = FILLER * depth + needle + FILLER * (n - depth)
    intro = (
        "There is an important piece of information hidden inside a lot of irrelevant text. Find it and memorize it."
        "\n\n"
    )
    return intro + text + "\n\nWhat is the pass key? The pass key is", key


def timed(model, tokenizer, prompt: str, compression: CompressionConfig, new_tokens: int) -> dict:
    engine = RolloutEngine(model, tokenizer, compression, chat=False)
    out = engine.generate([prompt], SamplingConfig(max_new_tokens=new_tokens, temperature=0, ignore_eos=True))
    s = out.stats
    steps = max(s["steps"] - 1, 1)  # decode forwards (the last sampled token is never fed back)
    return {
        "prefill_seconds": s["prefill_seconds"],
        "decode_seconds_per_token": s["decode_seconds"] / steps,
        "cache_bytes": s["kv_cache_bytes"],
        "prompt_tokens": int(out.prompt_lengths[0]),
    }


def memory_share(model, tokenizer, prompt: str, eta: float, new_tokens: int) -> dict:
    """The share reached at the end of ``new_tokens`` forced tokens, per meaning of ``eta``."""
    shares = {}
    for label, expected in (("eta_at_prompt_length", 0), ("eta_at_end_of_generation", None)):
        engine = RolloutEngine(
            model, tokenizer, CompressionConfig.of("s4r", eta=eta, expected_length=expected), chat=False
        )
        out = engine.generate([prompt], SamplingConfig(max_new_tokens=new_tokens, temperature=0, ignore_eos=True))
        shares[label] = out.memory_share[0].item()
    return {"prompt_tokens": int(out.prompt_lengths[0]), "memory_share": shares}


def projection_errors(model, tokenizer, prompt: str, completion: list[int], cfg: CompressionConfig) -> dict:
    """Mean relative reconstruction error of the generated tokens' pre-RoPE keys and values (over layers), by
    128-token stretch of the completion, under ``cfg``'s record of a replay of ``completion``."""
    engine = RolloutEngine(model, tokenizer, cfg, chat=False)
    out = engine.replay([prompt], [completion], SamplingConfig(max_new_tokens=len(completion)))
    rec, P = out.record, int(out.prompt_lengths[0])
    states: dict[str, list[torch.Tensor]] = {"k": [], "v": []}
    hooks = [
        layer.self_attn.k_proj.register_forward_hook(lambda m, i, o: states["k"].append(o[0].float()))
        for layer in model.model.layers
    ]
    hooks += [
        layer.self_attn.v_proj.register_forward_hook(lambda m, i, o: states["v"].append(o[0].float()))
        for layer in model.model.layers
    ]
    try:
        with torch.no_grad():
            model(out.sequences[:, -(P + len(completion)) :])
    finally:
        for hook in hooks:
            hook.remove()
    result = {}
    for kind, bases, ranks in (("k", rec.bases_k[0], rec.key_rank[0]), ("v", rec.bases_v[0], rec.value_rank[0])):
        errors = []
        for layer, x in enumerate(states[kind]):  # x [T, D'] (all KV heads side by side)
            x = x[P : P + len(completion) - 1]  # the generated tokens that were stored
            r = ranks[P : P + len(completion) - 1].long()
            coef = (x @ bases[layer]) * (torch.arange(bases.shape[-1])[None, :] < r[:, None])
            errors.append((x - coef @ bases[layer].T).norm(dim=-1) / x.norm(dim=-1).clamp_min(1e-12))
        per_token = torch.stack(errors).mean(0)  # [C - 1]
        result[kind] = [round(chunk.mean().item(), 4) for chunk in per_token.split(128)]
    return result


def passkey_accuracy(model, tokenizer, cases, compression: CompressionConfig, batch: int) -> dict:
    engine = RolloutEngine(model, tokenizer, compression, chat=False)
    correct, retention = 0, []
    for start in range(0, len(cases), batch):
        chunk = cases[start : start + batch]
        out = engine.generate([p for p, _ in chunk], SamplingConfig(max_new_tokens=10, temperature=0))
        for i, (_, key) in enumerate(chunk):
            text = tokenizer.decode(out.completions()[i], skip_special_tokens=True)
            found = re.findall(r"\d{5}", text)
            correct += bool(found) and found[0] == key
            retention.append(out.retention[i].item())
    return {
        "accuracy": correct / len(cases),
        "correct": correct,
        "cases": len(cases),
        "retention": sum(retention) / len(retention),
    }


def basis_cost(model, tokenizer, contexts: list[int], eta: float, repeats: int) -> dict:
    """Per prompt length: the median prefill seconds and S4R's own seconds (``compress_seconds``) of the full
    cache, S4R with sampled bases and S4R with ``basis=prompt``, one prompt, one forced new token."""
    configs = {
        "full": CompressionConfig("full"),
        "s4r_sampled": CompressionConfig.of("s4r", eta=eta),
        "s4r_prompt": CompressionConfig.of("s4r", eta=eta, basis="prompt"),
    }
    found = {}
    for context in contexts:
        prompt = long_prompt(tokenizer, context)
        rows = {}
        for name, cfg in configs.items():
            engine = RolloutEngine(model, tokenizer, cfg, chat=False)
            runs = [
                engine.generate([prompt], SamplingConfig(max_new_tokens=1, temperature=0, ignore_eos=True)).stats
                for _ in range(repeats)
            ]
            rows[name] = {
                "prefill_seconds": sorted(r["prefill_seconds"] for r in runs)[repeats // 2],
                "s4r_seconds": sorted(r["compress_seconds"] for r in runs)[repeats // 2],
            }
        rows["prompt_tokens"] = len(tokenizer(prompt)["input_ids"])
        found[str(context)] = rows
    return found


def tables(view: str, result: dict | list[dict]) -> str:
    """``scripts/render_docs.py``'s views: ``refresh`` (``--refresh``'s line: the relative reconstruction error of
    generated keys and values per 128-token stretch, with and without refresh) and ``timing`` (the timing
    runs' lines, ``results/bench_s4r_timing.jsonl``: decode and prefill against the full cache), each with where
    it came from."""
    if view == "refresh":
        errors = result["relative_error_by_128_tokens"]
        stretches = len(errors["s4r"]["k"])
        lines = [
            "| stretch of the completion | " + " | ".join(str(i + 1) for i in range(stretches)) + " |",
            "|---|" + "---|" * stretches,
        ]
        for kind, label in (("k", "keys"), ("v", "values")):
            for run, bases in (("s4r", "prompt bases"), ("s4r_refresh", f"refresh {result['refresh']}")):
                lines.append(f"| {label}, {bases} | " + " | ".join(f"{e:.3f}" for e in errors[run][kind]) + " |")
        return "\n".join(lines) + f"\n\n{provenance(result)}\n"
    if view == "timing":
        lines = [
            "| run | decode full (s / token) | decode s4r | s4r / full | reconstruct all (rho 1) | prefill s4r / "
            "full |",
            "|---|---|---|---|---|---|",
        ]
        for i, r in enumerate(result, 1):
            d = r["decode_seconds_per_token"]
            lines.append(
                f"| {i} | {d['full']:.3f} | {d['s4r']:.3f} | {r['decode_ratio_s4r_vs_full']:.2f}x "
                f"| {d['s4r_reconstruct_all']:.3f} | {r['prefill_ratio_s4r_vs_full']:.2f}x |"
            )
        return "\n".join(lines) + "\n\n" + "\n".join(sorted({f"runs: {provenance(r)}" for r in result})) + "\n"
    if view == "basis":
        lines = [
            "| prompt tokens | prefill, full (s) | S4R sampled bases (s) | of which S4R's own | S4R whole-prompt "
            "bases (s) | of which S4R's own | whole-prompt / sampled, S4R's own |",
            "|---|---|---|---|---|---|---|",
        ]
        for rows in result["cost"].values():
            full, sampled, whole = rows["full"], rows["s4r_sampled"], rows["s4r_prompt"]
            lines.append(
                f"| {rows['prompt_tokens']} | {full['prefill_seconds']:.2f} | {sampled['prefill_seconds']:.2f} | "
                f"{sampled['s4r_seconds']:.2f} | {whole['prefill_seconds']:.2f} | {whole['s4r_seconds']:.2f} | "
                f"{whole['s4r_seconds'] / sampled['s4r_seconds']:.2f}x |"
            )
        return "\n".join(lines) + f"\n\n{provenance(result)}\n"
    raise SystemExit(f"error: bench_s4r has the views refresh, timing and basis, not {view!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--context", type=count, default=4000)
    parser.add_argument("--new-tokens", type=count, default=128)
    parser.add_argument("--eta", type=positive_fraction, default=0.2)
    parser.add_argument("--cases", type=natural, default=20, help="passkey cases (0: timing and memory only)")
    parser.add_argument("--batch", type=count, default=2)
    parser.add_argument("--seed", type=natural, default=0)
    parser.add_argument("--memory-share", action="store_true", help="only the memory share of eta's two meanings")
    parser.add_argument(
        "--refresh", type=natural, default=0, help="only the refresh comparison, refreshing every N tokens"
    )
    parser.add_argument(
        "--basis-cost", nargs="+", type=count, help="only the prefill cost of the bases at these lengths"
    )
    parser.add_argument("--repeats", type=count, default=3, help="--basis-cost: runs per configuration (the median)")
    args = parser.parse_args()

    model, tokenizer = load_model(args.model)
    where = origin()
    if args.basis_cost:
        timed(model, tokenizer, long_prompt(tokenizer, 500), CompressionConfig.of("s4r", eta=args.eta), 1)  # warm-up
        cost = basis_cost(model, tokenizer, args.basis_cost, args.eta, args.repeats)
        print_json({"benchmark": "s4r_basis", "model": args.model, "eta": args.eta, "cost": cost, **where})
        return
    prompt = long_prompt(tokenizer, args.context)
    if args.refresh:
        print_json({"benchmark": "s4r_refresh", **refresh_comparison(model, tokenizer, prompt, args), **where})
        return
    if args.memory_share:
        shares = memory_share(model, tokenizer, prompt, args.eta, args.new_tokens)
        print_json(
            {
                "benchmark": "s4r_memory_share",
                "model": args.model,
                "eta": args.eta,
                "new_tokens": args.new_tokens,
                **shares,
                **where,
            }
        )
        return
    print_json({"benchmark": "s4r", **speed_and_passkey(model, tokenizer, prompt, args), **where})


def refresh_comparison(model, tokenizer, prompt: str, args) -> dict:
    """S4R with and without a refresh of its bases every ``--refresh`` tokens: the reconstruction's relative error
    on one sampled completion, and the decode time per token against the full cache."""
    s4r = CompressionConfig.of("s4r", eta=args.eta)
    engine = RolloutEngine(model, tokenizer, CompressionConfig("full"), chat=False)
    sampled = engine.generate(
        [prompt],
        SamplingConfig(max_new_tokens=args.new_tokens, temperature=0.6, top_p=0.95, seed=args.seed, ignore_eos=True),
    )
    completion = sampled.completions()[0]
    configs = {"s4r": s4r, "s4r_refresh": CompressionConfig.of("s4r", eta=args.eta, refresh=args.refresh)}
    errors = {name: projection_errors(model, tokenizer, prompt, completion, c) for name, c in configs.items()}
    timed(model, tokenizer, prompt, s4r, 4)  # warm-up
    times = {
        name: timed(model, tokenizer, prompt, c, args.new_tokens)["decode_seconds_per_token"]
        for name, c in {"full": CompressionConfig("full"), **configs}.items()
    }
    return {
        "model": args.model,
        "eta": args.eta,
        "refresh": args.refresh,
        "prompt_tokens": int(sampled.prompt_lengths[0]),
        "new_tokens": args.new_tokens,
        "relative_error_by_128_tokens": errors,
        "decode_seconds_per_token": times,
        "decode_ratio_refresh_vs_s4r": times["s4r_refresh"] / times["s4r"],
        "decode_ratio_refresh_vs_full": times["s4r_refresh"] / times["full"],
    }


def speed_and_passkey(model, tokenizer, prompt: str, args) -> dict:
    """Prefill and decode time and persistent memory of S4R against the full cache on ``prompt``; with ``--cases``,
    passkey accuracy of full, S4R, StreamingLLM and G-KV at S4R's budget."""
    s4r = CompressionConfig.of("s4r", eta=args.eta)
    timed(model, tokenizer, prompt[:2000], s4r, 4)  # warm-up: first-call allocations are not S4R's cost
    full = timed(model, tokenizer, prompt, CompressionConfig("full"), args.new_tokens)
    sparse = timed(model, tokenizer, prompt, s4r, args.new_tokens)
    everything = timed(model, tokenizer, prompt, CompressionConfig.of("s4r", eta=args.eta, rho=1.0), args.new_tokens)

    budget, passkey = None, None
    if args.cases > 0:
        rng = random.Random(args.seed)
        cases = [passkey_case(tokenizer, args.context, rng) for _ in range(args.cases)]
        budget = int(args.eta * len(tokenizer(cases[0][0])["input_ids"]))
        methods = {
            "full": CompressionConfig("full"),
            "s4r": s4r,
            "streaming": CompressionConfig("streaming", budget=budget, window=16, interval=32),
            "gkv": CompressionConfig("gkv", budget=budget, window=16, interval=32),
        }
        passkey = {name: passkey_accuracy(model, tokenizer, cases, c, args.batch) for name, c in methods.items()}
    return {
        "model": args.model,
        "prompt_tokens": full["prompt_tokens"],
        "new_tokens": args.new_tokens,
        "eta": args.eta,
        "threads": torch.get_num_threads(),
        "prefill_seconds": {"full": full["prefill_seconds"], "s4r": sparse["prefill_seconds"]},
        "prefill_ratio_s4r_vs_full": sparse["prefill_seconds"] / full["prefill_seconds"],
        "decode_ratio_s4r_vs_full": sparse["decode_seconds_per_token"] / full["decode_seconds_per_token"],
        "decode_seconds_per_token": {
            "full": full["decode_seconds_per_token"],
            "s4r": sparse["decode_seconds_per_token"],
            "s4r_reconstruct_all": everything["decode_seconds_per_token"],
        },
        "persistent_bytes": {"s4r": sparse["cache_bytes"], "full": full["cache_bytes"]},  # prompt + new tokens
        "persistent_ratio_s4r_vs_full": sparse["cache_bytes"] / full["cache_bytes"],
        "passkey_budget_tokens": budget,
        "passkey": passkey,
    }


if __name__ == "__main__":
    main()
