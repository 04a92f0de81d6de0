"""Regenerate ``tests/fixtures/gkv_reference.pt``: kept sets of the reference G-KV implementation.

Runs the reference's own ``ScoreBasedKV.update_kv`` and ``StreamingLLMKV.update_kv`` (microsoft/G-KV at
6db3b2e) on small synthetic states, compression after compression, as its decoding loop drives them
(``gkv/model/modeling_llama.py`` + ``gkv/model/gen_patch.py``): prefill then one token at a time, the last
``window`` queries kept, compression at prefill and after every ``divide_length``-th generated token, the
score history carried between compressions, a left-padded batch. What is stored: the states (queries, keys),
the prompt lengths, the settings on both sides, and the reference's kept logical positions after every
compression, per layer, sequence and KV head (plus its score at the top-k boundary, to tell ties apart).

The reference's redundancy term is a Triton kernel; it runs here on CPU in Triton's interpreter
(``TRITON_INTERPRET=1``), or, when Triton is missing, through ``similarity_reference`` below, a plain-torch
restatement of the same kernel (the script checks that the two agree whenever both are available).

    mkdir -p outputs/reference/G-KV
    git -C <mirror of microsoft/G-KV> archive 6db3b2e | tar -x -C outputs/reference/G-KV
    python3 -m venv outputs/reference/venv
    outputs/reference/venv/bin/pip install torch transformers==4.51.1 triton numpy
    TRITON_INTERPRET=1 outputs/reference/venv/bin/python scripts/reference/make_fixtures.py \
        --reference-root outputs/reference/G-KV

Not part of the package: it imports the reference code, which carries no licence and is never copied here.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "gkv_reference.pt"

# Reference recipes (scripts/inference.sh) at a small scale, and the project settings that must reproduce them:
# only the sizes (budget, window, interval) are given on the project side, the rest are its defaults.
BUDGET, WINDOW, INTERVAL = 24, 4, 8
CASES = {
    "streaming": (dict(kind="streaming", window_size=BUDGET - 4, sink_len=4), dict(method="streaming")),
    "snapkv": (dict(enable_pooling=True), dict(method="snapkv")),
    "rkv": (dict(enable_pooling=True, suppressing_redundancy=True, mix_lambda=0.1), dict(method="rkv")),
    "gkv": (dict(suppressing_redundancy=True, mix_lambda=0.5, enable_score_cache=True, alpha=0.8), dict(method="gkv")),
    "gkv-mean": (
        dict(suppressing_redundancy=True, mix_lambda=0.5, enable_score_cache=True, alpha=0.8, smooth_method="mean"),
        dict(method="gkv", form="mean"),
    ),
    "gkv-sum": (
        dict(suppressing_redundancy=True, mix_lambda=0.5, enable_score_cache=True, alpha=0.8, smooth_method="sum"),
        dict(method="gkv", form="sum"),
    ),
    "gkv-pooled": (
        dict(suppressing_redundancy=True, mix_lambda=0.5, enable_score_cache=True, alpha=0.8, enable_pooling=True),
        dict(method="gkv", pool_kernel=5),
    ),
    "gkv-no-redundancy": (dict(enable_score_cache=True, alpha=0.8), dict(method="gkv", redundancy=False)),
    "h2o": (dict(enable_score_cache=True, smooth_method="sum", window_size=1), dict(method="h2o")),
}
LAYERS, KV_HEADS, GROUP, HEAD_DIM = 2, 2, 3, 16  # the Triton kernel's dot needs head_dim >= 16
PROMPTS, NEW_TOKENS = (40, 33), 33  # both prompts exceed the budget: compressions at prefill and every 8 tokens


def similarity_reference(keys: torch.Tensor, attention_mask: torch.Tensor, threshold: float = 0.5) -> torch.Tensor:
    """Plain-torch restatement of the reference's ``cal_similarity_triton`` (same inputs and output)."""
    real = attention_mask.bool()[:, None, :]  # [B, 1, S]
    unit = keys.float() / (keys.float().norm(dim=-1, keepdim=True) + 1e-6)
    cos = unit @ unit.transpose(-1, -2)
    cos.diagonal(dim1=-2, dim2=-1).zero_()
    cos = cos * real[:, :, None, :]  # columns: real keys only
    rows = torch.arange(cos.shape[-1])
    over = (cos > threshold) & real[:, :, :, None]
    latest = torch.where(over, rows[:, None], -1).amax(-2)  # per column: the most recent similar row
    cos = cos.masked_fill(rows[:, None] == latest[:, :, None, :], 0.0)
    sums = cos.sum(-1) / attention_mask.sum(-1)[:, None, None]
    return sums.masked_fill(~real, float("-inf")).softmax(-1)


def triton_similarity(module):
    """The reference kernel through Triton's interpreter, or None when Triton is unavailable.

    The interpreter reads out of bounds for blocks at negative offsets, so the keys are left-padded (masked
    out, which changes nothing: padding columns are skipped and padding rows masked) to a multiple of 64."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return None
    try:
        import numpy as np
        import triton.runtime.interpreter as interpreter
    except ImportError:
        return None
    patch = interpreter._patch_lang_tensor

    def patched(tensor):  # a loaded scalar is a 1-element array there, not a 0-d one
        patch(tensor)
        tensor.__index__ = lambda self: int(np.asarray(self.handle.data).reshape(-1)[0])

    interpreter._patch_lang_tensor = patched
    kernel = module.cal_similarity_triton

    def similarity(keys, attention_mask, **kwargs):
        S = keys.shape[-2]
        extra = -S % 64
        keys = torch.nn.functional.pad(keys, (0, 0, extra, 0))
        attention_mask = torch.nn.functional.pad(attention_mask, (extra, 0))
        return kernel(keys.contiguous(), attention_mask, **kwargs)[..., extra:]

    return similarity


def make_states(seed: int):
    """Queries and keys with structure: keys cluster around a few directions (so near-duplicates exist) and
    queries lean towards some of them (so attention is peaked)."""
    g = torch.Generator().manual_seed(seed)
    T = max(PROMPTS) + NEW_TOKENS
    B, H = len(PROMPTS), KV_HEADS * GROUP
    centers = torch.randn(LAYERS, KV_HEADS, 6, HEAD_DIM, generator=g)
    pick = torch.randint(0, 6, (LAYERS, B, KV_HEADS, T), generator=g)
    keys = torch.stack([centers[i, h][pick[i, :, h]] for i in range(LAYERS) for h in range(KV_HEADS)])
    keys = keys.view(LAYERS, KV_HEADS, B, T, HEAD_DIM).transpose(1, 2)
    keys = 1.2 * keys + torch.randn(LAYERS, B, KV_HEADS, T, HEAD_DIM, generator=g)
    queries = 0.8 * keys.repeat_interleave(GROUP, dim=2).roll(3, dims=3)
    queries = queries + torch.randn(LAYERS, B, H, T, HEAD_DIM, generator=g)
    return queries, keys


@contextlib.contextmanager
def capture_topk(sink: list):
    """Record the scores the reference ranks (its last ``topk`` call) to report ties at the boundary."""
    topk = torch.Tensor.topk

    def recording(self, k, *args, **kwargs):
        result = topk(self, k, *args, **kwargs)
        sink.append((self.detach().clone(), k))
        return result

    torch.Tensor.topk = recording
    try:
        yield
    finally:
        torch.Tensor.topk = topk


def run_case(reference, ref_kwargs, queries, keys):
    """Drive the reference compressor as its decoding loop does; returns per compression:
    (generated tokens so far, kept logical positions int64 [L, B, Hkv, budget], boundary tie flag [L, B, Hkv])."""
    ref_kwargs = dict(ref_kwargs)
    streaming = ref_kwargs.pop("kind", None) == "streaming"
    window = ref_kwargs.get("window_size", WINDOW)
    B, P, T = len(PROMPTS), max(PROMPTS), max(PROMPTS) + NEW_TOKENS
    pads = torch.tensor([P - p for p in PROMPTS])
    mask = (torch.arange(T)[None, :] >= pads[:, None]).long()
    if streaming:
        compressor = reference.StreamingLLMKV(**ref_kwargs)
    else:
        compressor = reference.ScoreBasedKV(budget=BUDGET, **{"window_size": WINDOW, **ref_kwargs})
    values = torch.zeros_like(keys)
    state = []
    for layer in range(LAYERS):
        state.append(
            dict(
                keys=keys[layer, :, :, :P],
                values=values[layer, :, :, :P],
                queries=queries[layer, :, :, P - window : P],
                pos=torch.arange(P).expand(B, KV_HEADS, P).clone(),
                score=None,
            )
        )
    results = []
    for step in range(NEW_TOKENS):  # forward 0 is the prefill; forward j feeds generated token j (1-based)
        if step > 0:
            t = P + step - 1
            for layer, s in enumerate(state):
                s["keys"] = torch.cat([s["keys"], keys[layer, :, :, t : t + 1]], dim=2)
                s["values"] = torch.cat([s["values"], values[layer, :, :, t : t + 1]], dim=2)
                s["queries"] = torch.cat([s["queries"], queries[layer, :, :, t : t + 1]], dim=2)[:, :, -window:]
                s["pos"] = torch.cat([s["pos"], s["pos"][:, :, -1:] + 1], dim=2)
        if step % INTERVAL:
            continue
        length = P + step
        compressed = keys_seen = None
        kept, ties = [], []
        for layer, s in enumerate(state):
            keys_seen = s["keys"].shape[2]
            ranked = []
            with capture_topk(ranked):
                out = compressor.update_kv(
                    key_states=s["keys"],
                    query_states=s["queries"],
                    value_states=s["values"],
                    pos_ids_cache=None if streaming else s["pos"],
                    cur_len=length,
                    attention_mask=mask[:, :length],
                    unfinished_sequences=torch.ones(B, dtype=torch.long),
                    score_cache=s["score"],
                )
            new_keys, new_values, new_pos, new_score = out
            compressed = new_keys.shape[2] < keys_seen
            if streaming and compressed:  # StreamingLLMKV keeps no positions: the first sinks and the last window
                sinks = torch.stack([torch.arange(ref_kwargs["sink_len"]) + pads[b] for b in range(B)])
                recent = torch.arange(length - ref_kwargs["window_size"], length).expand(B, -1)
                new_pos = torch.cat([sinks, recent], dim=1)[:, None].expand(B, KV_HEADS, -1)
            s.update(keys=new_keys, values=new_values, score=new_score)
            if new_pos is not None:
                s["pos"] = new_pos
            kept.append(s["pos"] - pads[:, None, None])
            tie = torch.zeros(B, KV_HEADS, dtype=torch.bool)
            if ranked:
                score, k = ranked[-1]
                top = score.topk(k + 1, dim=-1).values
                tie = (top[..., k - 1] - top[..., k]).abs() <= 1e-6 * top[..., 0].abs().clamp_min(1e-12)
            ties.append(tie)
        if compressed:
            results.append((step, torch.stack(kept), torch.stack(ties)))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference-root", required=True, help="a checkout of microsoft/G-KV at 6db3b2e")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=OUT)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(args.reference_root).resolve()))
    scores_module = importlib.import_module("gkv.utils.compression_score")
    triton_kernel = triton_similarity(scores_module)
    probe = torch.randn(2, 2, 37, HEAD_DIM)
    probe[:, :, ::3] += 2
    probe_mask = torch.ones(2, 37, dtype=torch.long)
    probe_mask[0, :5] = 0
    if triton_kernel is not None:
        gap = (triton_kernel(probe, probe_mask) - similarity_reference(probe, probe_mask)).abs().max().item()
        assert gap < 1e-6, f"the torch restatement differs from the Triton kernel by {gap}"
        print(f"redundancy: reference Triton kernel (interpreter); torch restatement agrees to {gap:.1e}")
    similarity = triton_kernel or similarity_reference
    score_based = importlib.import_module("gkv.model.compression.score_based")
    score_based.cal_similarity_triton = similarity
    reference = importlib.import_module("gkv.model.compression")

    queries, keys = make_states(args.seed)
    fixture = dict(
        source="microsoft/G-KV@6db3b2e",
        seed=args.seed,
        budget=BUDGET,
        window=WINDOW,
        interval=INTERVAL,
        prompt_lengths=list(PROMPTS),
        new_tokens=NEW_TOKENS,
        queries=queries,
        keys=keys,
        redundancy_kernel="triton-interpreter" if triton_kernel else "torch-restatement",
        cases={},
    )
    for name, (ref_kwargs, project) in CASES.items():
        results = run_case(reference, ref_kwargs, queries, keys)
        ties = sum(int(t.sum()) for _, _, t in results)
        fixture["cases"][name] = dict(
            reference=ref_kwargs,
            project=dict(project, budget=BUDGET, interval=INTERVAL, **({} if name == "h2o" else {"window": WINDOW})),
            steps=[s for s, _, _ in results],
            kept=[k for _, k, _ in results],
            ties=[t for _, _, t in results],
        )
        print(f"{name}: {len(results)} compressions, {ties} boundary ties")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    torch.save(fixture, args.output)
    print(f"wrote {args.output} ({args.output.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
