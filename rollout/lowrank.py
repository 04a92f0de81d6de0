"""Pure functions of S4R's low-rank cache: rank, sampling, bases, RoPE, latent scores, selection.

Shapes: ``B`` batch, ``Hkv`` KV heads, ``D`` head dim, ``D' = Hkv * D`` (all KV heads of a layer side by side),
``G`` query heads per KV head, ``W`` query window, ``S`` cache slots, ``r`` rank.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def s4r_rank(eta: float, sinks: int, length: int, dim: int, groups: int, window: int) -> int:
    """The rank r that makes the persistent memory a share ``eta`` of the full cache at ``length`` tokens:
    (s D' + L r + G W r / 2 + D' r) / ((s + L) D') = eta, floored, within [1, D']."""
    r = (eta * (sinks + length) * dim - sinks * dim) / (length + 0.5 * groups * window + dim)
    return max(1, min(dim, math.floor(r)))


def persistent_elements(sinks: int, length: int, dim: int, groups: int, window: int, rank_k: int, rank_v: int) -> int:
    """Numbers an S4R layer stores for one sequence: exact sink keys and values, key and value coefficients
    of every other token, the projected query window, and the two bases. With r_k = r_v = r this is twice the
    numerator of ``s4r_rank``'s equation."""
    return 2 * sinks * dim + length * (rank_k + rank_v) + groups * window * rank_k + dim * (rank_k + rank_v)


def sample_positions(n: int, count: int, recent_ratio: float) -> torch.Tensor:
    """``count`` of ``n`` positions for the bases: the most recent ``round(count * recent_ratio)`` as one block,
    the rest spread uniformly over the earlier ones. Returns sorted unique int64 indices (all when count >= n)."""
    if count >= n:
        return torch.arange(n)
    recent = min(count, round(count * recent_ratio))
    earlier = n - recent
    uniform = torch.arange(count - recent) * earlier // (count - recent) if count > recent else torch.arange(0)
    return torch.cat([uniform, torch.arange(earlier, n)])  # distinct: the uniform stride is at least 1


def low_rank_bases(samples: torch.Tensor, rank: int, normalize: bool) -> torch.Tensor:
    """Orthonormal bases [B, D', rank] of sampled states samples [B, T', D'] (zero rows are padding) by
    truncated SVD, each row first scaled to unit length when ``normalize``. With fewer independent samples than
    ``rank`` the remaining columns complete the basis orthonormally, so a rank of D' always reconstructs
    exactly."""
    x = F.normalize(samples.float(), dim=-1) if normalize else samples.float()
    _, _, vh = torch.linalg.svd(x, full_matrices=True)
    return vh[:, :rank].transpose(-1, -2)


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


def latent_scores(
    cq: torch.Tensor, q_pos: torch.Tensor, q_ok: torch.Tensor, ck: torch.Tensor, k_pos: torch.Tensor,
    k_ok: torch.Tensor, rank: torch.Tensor,
) -> torch.Tensor:
    """S4R token scores in the latent space: softmax(C_Q C_K^T / sqrt(r)) with a causal mask, averaged over the
    valid window queries.

    cq [B, G, W, r]; q_pos int64 [B, W]; q_ok bool [B, W]; ck [B, S, r]; k_pos int64 [B, S]; k_ok bool [B, S];
    rank [B] each sequence's rank. Returns float32 [B, G, S].
    """
    z = cq.float() @ ck.float().transpose(-1, -2)[:, None] / rank.float().sqrt()[:, None, None, None]
    visible = k_ok[:, None, None, :] & (k_pos[:, None, None, :] <= q_pos[:, None, :, None])
    visible = visible | ~q_ok[:, None, :, None]  # invalid rows: anything finite, weighted 0 below
    probs = z.masked_fill(~visible, float("-inf")).softmax(-1)
    weight = q_ok.float() / q_ok.sum(-1, keepdim=True).clamp_min(1)
    return (weight[:, None, None, :] @ probs).squeeze(-2)


def select_tokens(
    score: torch.Tensor, k_pos: torch.Tensor, k_ok: torch.Tensor, position: torch.Tensor, count: torch.Tensor,
    window: int, rho: float, full: bool,
) -> torch.Tensor:
    """Which slots a decode step reconstructs: the last ``window`` positions (the current one included) plus the
    top k = max(floor(rho * count) - window, 0) others by score; every occupied slot when ``full``.

    score [B, S]; k_pos int64 [B, S]; k_ok bool [B, S]; position int64 [B] the current query's position;
    count int64 [B] occupied slots (the cache length L_t). Returns bool [B, S].
    """
    if full:
        return k_ok.clone()
    local = k_ok & (k_pos > (position - window)[:, None])
    k = (torch.floor(rho * count.double()).long() - window).clamp_min(0)
    ranked = score.float().masked_fill(~k_ok | local, float("-inf"))
    top = int(k.max())
    chosen = torch.zeros_like(k_ok)
    if top > 0:
        values, index = ranked.topk(min(top, ranked.shape[-1]), dim=-1)
        keep = (torch.arange(index.shape[-1], device=k.device)[None, :] < k[:, None]) & torch.isfinite(values)
        chosen.scatter_(-1, index, keep)
    return local | chosen
