"""Rotary embeddings applied and undone, and a layer's KV heads side by side (what S4R's bases act on).

Shapes: ``B`` batch, ``H`` / ``Hkv`` query / KV heads, ``T`` tokens, ``D`` head dim, ``D' = Hkv * D``.
"""

from __future__ import annotations

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [B, H, T, D] with cos/sin [B, T, D] (as the model's rotary module returns them)."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def inverse_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Undo ``apply_rope``: rotating back by the same angles recovers the pre-RoPE states exactly (up to float
    error), which is how S4R gets pre-RoPE keys and queries from what the attention function receives."""
    return x * cos[:, None] - rotate_half(x) * sin[:, None]


def heads_to_concat(x: torch.Tensor) -> torch.Tensor:
    """[B, Hkv, T, D] -> [B, T, Hkv * D]: a layer's KV heads side by side."""
    B, H, T, D = x.shape
    return x.transpose(1, 2).reshape(B, T, H * D)


def concat_to_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, T, Hkv * D] -> [B, Hkv, T, D]."""
    B, T, DD = x.shape
    return x.view(B, T, heads, DD // heads).transpose(1, 2)


def group_queries(query: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """Queries [B, H, T, D] -> [B, G, T, Hkv * D]: member g of every GQA group side by side (query head
    h * G + g belongs to KV head h), so that q_g . k = sum over KV heads of the attention logits."""
    B, H, T, D = query.shape
    G = H // kv_heads
    return query.view(B, kv_heads, G, T, D).permute(0, 2, 3, 1, 4).reshape(B, G, T, kv_heads * D)
