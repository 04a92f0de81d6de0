"""Timing one rollout, alike for every caller (``bench_rollout.py``, ``gpu_check.py``): the engine, eager or
with compiled decode steps (cold, then warm), and stock HF ``generate``; tokens/s, the compression share of decode,
the KV cache's bytes, and with given prefixes the seconds they took."""

from __future__ import annotations

import dataclasses
import time

import torch

from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_rollout.contract.attention import ATTENTION_NAME
from gkv_rollout.engine import RolloutEngine, left_pad


def hf_generate(model, tokenizer, prompts, sampling: SamplingConfig) -> dict:
    """Stock ``generate`` (SDPA, dynamic cache) on the same prompts and sampling settings."""
    weight = next(model.parameters())
    ids, mask = left_pad(prompts, tokenizer.pad_token_id, weight.device)
    model.set_attn_implementation("sdpa")
    torch.manual_seed(sampling.seed)
    try:
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=0,
                max_new_tokens=sampling.max_new_tokens,
                min_new_tokens=sampling.max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
        seconds = time.perf_counter() - start
    finally:
        model.set_attn_implementation(ATTENTION_NAME)
    new_tokens = (out.shape[1] - ids.shape[1]) * ids.shape[0]
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_bytes = 2 * cfg.num_hidden_layers * ids.shape[0] * cfg.num_key_value_heads * out.shape[1] * head_dim
    kv_bytes *= weight.element_size()
    return {"tokens_per_s": new_tokens / seconds, "seconds": seconds, "peak_kv_cache_bytes": kv_bytes}


def engine_run(
    model, tokenizer, prompts, sampling: SamplingConfig, compression: CompressionConfig, prefixes=None
) -> dict:
    """One rollout's statistics (``prefixes``: each prompt's given beginning, ``RolloutEngine.generate``'s);
    ``given_seconds``: the part of the decode the given tokens took; ``forwards``: the decode forwards."""
    out = RolloutEngine(model, tokenizer, compression).generate(prompts, sampling, prefixes=prefixes)
    s = out.stats
    return {
        "tokens_per_s": s["tokens_per_s"],
        "seconds": s["seconds"],
        "prefill_seconds": s["prefill_seconds"],
        "given_seconds": s["given_seconds"],
        "forwards": s["forwards"],
        "compress_fraction_of_decode": s["compress_seconds"] / s["decode_seconds"],
        "compressions": s["compressions"],
        "peak_kv_cache_bytes": s["kv_cache_bytes"],
        "record_bytes_per_sample": s["record_bytes_per_sample"],
        "retention": out.retention.mean().item(),
    }


def compiled_run(model, tokenizer, prompts, sampling: SamplingConfig, compression: CompressionConfig) -> dict:
    """``engine_run`` with compiled decode steps: cold (compiling) then warm."""
    sampling = dataclasses.replace(sampling, compile_decode=True)
    cold = engine_run(model, tokenizer, prompts, sampling, compression)
    warm = engine_run(model, tokenizer, prompts, sampling, compression)
    new_tokens = warm["tokens_per_s"] * warm["seconds"]
    return {
        **warm,
        "compile_seconds": cold["seconds"] - warm["seconds"],
        "tokens_per_s_with_compile": new_tokens / cold["seconds"],
    }
