"""The checks to run once on a CUDA machine, one JSON line: consistency, masked training cost, rollout speed.

On models built from real configurations with random weights (a GPU machine may hold no weights):

* consistency: for ``gkv`` and ``s4r``, in fp32 and bf16, a rollout's log-probs against the trainer's under its
  record with the FlexAttention backend (max |diff|), and the two controls that must fail (a plain causal mask,
  the records rotated by one layer);
* training cost: forward + backward of the same batch under the record (FlexAttention) against plain causal
  SDPA, time and peak memory;
* rollout: the engine with ``full`` and ``gkv`` (budget 512) against HF ``generate``, batch 64, 2048 new tokens,
  tokens/s and peak memory; on CUDA (or with ``--compile-decode``) also with ``compile_decode`` (decode steps as
  CUDA graphs), cold (compiling and capturing) and warm.

    python scripts/gpu_check.py                    # CUDA: Qwen2.5-1.5B and Llama-3.2-1B shapes, < 8 minutes on an H200
    python scripts/gpu_check.py --shapes qwen2.5-1.5b --batch 32
    python scripts/gpu_check.py --tiny             # CPU: tiny shapes and sizes, the same code paths (SDPA for flex
                                                   # in the training-cost part: FlexAttention's CPU backward is slow)
"""

from __future__ import annotations

import argparse
import time

import torch
from _common import print_json, random_prompts
from bench_rollout import compiled_run, engine_run, hf_generate
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from gkv_train.consistency import consistency_report
from gkv_train.logprobs import token_logprobs
from gkv_train.models import tiny_config, tiny_tokenizer
from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_rollout.contract.attention import ATTENTION_NAME, register
from gkv_rollout.engine import RolloutEngine

# Architectures of public checkpoints (their config.json), built here without their weights.
SHAPES = {
    "qwen2.5-1.5b": lambda: Qwen2Config(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "llama-3.2-1b": lambda: LlamaConfig(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_theta=5e5, tie_word_embeddings=True, rope_scaling={
            "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "tiny-llama": lambda: tiny_config("tiny-llama"),
    "tiny-qwen2": lambda: tiny_config("tiny-qwen2"),
}  # fmt: skip
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build(shape: str, dtype: torch.dtype, device: str, seed: int = 0):
    """A random-weight model of ``shape`` on the registered attention (deterministic in ``seed``)."""
    register()
    config = SHAPES[shape]()
    config._attn_implementation = ATTENTION_NAME
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).eval()


def peak_memory(device: str) -> int | None:
    """Peak bytes allocated on the CUDA device since the last reset (None on CPU)."""
    return torch.cuda.max_memory_allocated() if device == "cuda" else None


def reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def timed(fn, device: str) -> tuple[float, int | None]:
    """Seconds and peak memory of ``fn()`` (synchronised on CUDA)."""
    reset_peak(device)
    start = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, peak_memory(device)


def consistency(model, tokenizer, prompts, method: str, args) -> dict:
    """Rollout vs trainer under the record (FlexAttention), with both controls."""
    compression = CompressionConfig(method, budget=args.check_budget, window=args.check_window,
                                    interval=args.check_interval)  # fmt: skip
    sampling = SamplingConfig(max_new_tokens=args.check_tokens, temperature=1.0, seed=0, ignore_eos=True)
    out = RolloutEngine(model, tokenizer, compression).generate(prompts, sampling)
    report = consistency_report(model, out, backend="flex")
    return {**report, "retention": round(out.retention.mean().item(), 4)}


def training_cost(model, tokenizer, prompts, args, backend: str) -> dict:
    """Forward + backward of one rollout batch under its gkv record (``backend``) and under a plain causal mask."""
    compression = CompressionConfig("gkv", budget=args.check_budget, window=args.check_window,
                                    interval=args.check_interval)  # fmt: skip
    sampling = SamplingConfig(max_new_tokens=args.check_tokens, temperature=1.0, seed=0, ignore_eos=True)
    out = RolloutEngine(model, tokenizer, compression).generate(prompts, sampling)
    model.train()

    def step(record):
        model.zero_grad(set_to_none=True)
        logps = token_logprobs(model, out.sequences, out.attention_mask, out.num_completion_tokens, record,
                               backend=backend)  # fmt: skip
        logps[out.completion_mask.bool()].sum().backward()

    step(out.record)  # warm-up (compiles FlexAttention's kernels)
    masked_s, masked_mem = timed(lambda: step(out.record), args.device)
    step(None)
    sdpa_s, sdpa_mem = timed(lambda: step(None), args.device)
    model.zero_grad(set_to_none=True)
    model.eval()
    return {
        "backend": backend, "tokens": int(out.attention_mask.sum()), "masked_seconds": masked_s,
        "causal_sdpa_seconds": sdpa_s, "time_ratio": masked_s / sdpa_s, "masked_peak_bytes": masked_mem,
        "causal_sdpa_peak_bytes": sdpa_mem,
    }  # fmt: skip


def rollout_speed(model, tokenizer, prompts, args) -> dict:
    """Engine (full, gkv; eager and, with ``args.compile_decode``, compiled) against HF generate: tokens/s and
    peak memory at the same batch and length."""
    sampling = SamplingConfig(max_new_tokens=args.rollout_tokens, temperature=0.6, top_p=0.95, seed=0,
                              ignore_eos=True)  # fmt: skip
    gkv = CompressionConfig("gkv", budget=args.rollout_budget, window=args.rollout_window)
    result = {}
    for compression in (CompressionConfig("full"), gkv):
        runs = [("", engine_run)] + ([("_compiled", compiled_run)] if args.compile_decode else [])
        for suffix, run in runs:
            reset_peak(args.device)
            result[f"engine_{compression.method}{suffix}"] = run(model, tokenizer, prompts, sampling, compression)
            result[f"engine_{compression.method}{suffix}"]["peak_bytes"] = peak_memory(args.device)
    reset_peak(args.device)
    hf = hf_generate(model, tokenizer, prompts, sampling)
    hf["peak_bytes"] = peak_memory(args.device)
    speedups = {f"speedup_{name[len('engine_'):]}": run["tokens_per_s"] / hf["tokens_per_s"] for name, run in result.items()}
    return {**result, "hf_generate": hf, **speedups}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="CPU-sized: tiny shapes, small batches and lengths")
    parser.add_argument("--shapes", nargs="+", default=None, choices=sorted(SHAPES))
    parser.add_argument("--batch", type=int, default=None, help="rollout-speed batch (64; --tiny 4)")
    parser.add_argument("--compile-decode", action="store_true", help="time compiled decode steps (default on CUDA)")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        parser.error("no CUDA device: run with --tiny on CPU")
    args.device = "cuda" if cuda else "cpu"
    args.compile_decode = args.compile_decode or cuda
    tiny = args.tiny
    args.shapes = args.shapes or (["tiny-llama", "tiny-qwen2"] if tiny else ["qwen2.5-1.5b", "llama-3.2-1b"])
    args.batch = args.batch or (4 if tiny else 64)
    args.check_tokens, args.check_budget, args.check_window, args.check_interval = (
        (24, 16, 4, 8) if tiny else (256, 128, 16, 32)
    )
    args.rollout_tokens, args.rollout_budget, args.rollout_window = (32, 16, 4) if tiny else (2048, 512, None)
    tokenizer = tiny_tokenizer()  # prompts are token ids; the engine needs only its padding and end ids

    start = time.perf_counter()
    result = {"check": "gpu", "device": torch.cuda.get_device_name() if cuda else "cpu", "shapes": {}}
    for shape in args.shapes:
        entry = result["shapes"][shape] = {}
        for precision, dtype in DTYPES.items():
            model = build(shape, dtype, args.device)
            vocab = min(model.config.vocab_size, 1000)
            prompts = random_prompts([17 + 9 * i for i in range(4)], vocab, seed=1)
            for method in ("gkv", "s4r"):
                entry[f"consistency/{method}/{precision}"] = consistency(model, tokenizer, prompts, method, args)
            if precision == "bf16":
                backend = "sdpa" if tiny else "flex"
                entry["training_cost/bf16"] = training_cost(model, tokenizer, prompts, args, backend)
                rollout_prompts = random_prompts([64 + (i % 8) for i in range(args.batch)], vocab, seed=2)
                entry["rollout/bf16"] = rollout_speed(model, tokenizer, rollout_prompts, args)
            del model
    result["seconds"] = round(time.perf_counter() - start, 1)
    print_json(result)


if __name__ == "__main__":
    main()
