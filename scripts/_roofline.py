"""What the GPU check (``gpu_check.py``) times and holds its figures against: seconds and peak memory of a call
(synchronised on CUDA), the measured ceilings (the bf16 matrix rate and the memory bandwidth), and a decode
step's or a training step's FLOPs and bytes from the model's configuration with the time the roofline allows."""

from __future__ import annotations

import time

import torch

from gkv_rollout.contract.attention import head_dim


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


def hardware(device: str, tiny: bool) -> dict:
    """Measured ceilings: the bf16 matrix rate (n x n x n products) and the memory bandwidth (a copy of a large
    buffer: bytes read + written), mean of timed repeats after warm-ups."""
    n, numel, repeats = (512, 2**22, 3) if tiny else (8192, 2**30, 10)
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    for _ in range(2):
        a @ b
    seconds, _ = timed(lambda: [a @ b for _ in range(repeats)], device)
    flops = 2 * n**3 * repeats / seconds
    src = torch.empty(numel, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    seconds, _ = timed(lambda: [dst.copy_(src) for _ in range(repeats)], device)
    bandwidth = 2 * src.numel() * src.element_size() * repeats / seconds
    return {"bf16_matmul_flops_per_s": flops, "memory_bytes_per_s": bandwidth, "matmul_n": n, "copy_bytes": numel * 2}


def matmul_params(config) -> tuple[int, int]:
    """(weights every token multiplies by in the decoder layers, in the LM head) of a Llama/Qwen2 config."""
    hidden, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    q = config.num_attention_heads * head_dim(config)
    kv = config.num_key_value_heads * head_dim(config)
    per_layer = hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inter
    return layers * per_layer, hidden * config.vocab_size


def decode_step_cost(config, batch: int, context: float, dtype_bytes: int = 2) -> dict:
    """FLOPs and bytes of one decode step of ``batch`` sequences attending to ``context`` keys each: the
    weights' products (2 per weight and token) and attention (QK^T and AV: 4 H D per key); the weights read
    once, the keys and values read per sequence."""
    layers, head = matmul_params(config)
    d, heads, kv_heads = head_dim(config), config.num_attention_heads, config.num_key_value_heads
    flops = 2 * (layers + head) * batch + 4 * config.num_hidden_layers * heads * d * context * batch
    bytes_ = (layers + head) * dtype_bytes + 2 * config.num_hidden_layers * kv_heads * d * context * batch * dtype_bytes
    return {"flops": flops, "bytes": bytes_}


def ceiling(cost: dict, rates: dict, seconds: float) -> dict:
    """The time the roofline allows (the slower of compute and memory at the measured rates) and achieved /
    ceiling for a measured ``seconds``."""
    compute = cost["flops"] / rates["bf16_matmul_flops_per_s"]
    memory = cost.get("bytes", 0) / rates["memory_bytes_per_s"]
    bound = max(compute, memory)
    return {
        **cost,
        "ceiling_seconds": bound,
        "bound": "compute" if compute >= memory else "memory",
        "achieved_over_ceiling": bound / seconds if seconds > 0 else None,
    }
