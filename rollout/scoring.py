"""Scores that decide which cached tokens a G-KV-family compression keeps. Pure functions.

Shapes: ``B`` batch, ``Hkv`` KV heads, ``G`` query heads per KV head, ``W`` scoring queries, ``S`` cache
slots, ``D`` head dim. Slots hold keys in increasing logical position; ``key_ok`` marks the occupied ones.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rollout.config import CompressionConfig

_EPS = 1e-12


def window_attention(
    query: torch.Tensor,
    query_pos: torch.Tensor,
    query_ok: torch.Tensor,
    keys: torch.Tensor,
    key_pos: torch.Tensor,
    key_ok: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Mean attention that the scoring window pays to every cached key.

    query [B, Hkv, G, W, D] (after RoPE); query_pos int64 [B, W]; query_ok bool [B, W];
    keys [B, Hkv, S, D] (after RoPE); key_pos int64 [B, Hkv, S]; key_ok bool [B, S].
    Each valid query attends causally (key position <= its own) over the occupied slots; it always sees its own
    key, which the window keeps.
    Returns float32 [B, Hkv, G, S]: softmax attention averaged over the valid window queries.
    """
    B, Hkv, G, W, D = query.shape
    scaled = query.float().reshape(B, Hkv, G * W, D) * scale
    logits = (scaled @ keys.float().transpose(-1, -2)).view(B, Hkv, G, W, -1)
    visible = key_ok[:, None, None, None, :] & (key_pos[:, :, None, None, :] <= query_pos[:, None, None, :, None])
    visible = visible | ~query_ok[:, None, None, :, None]  # invalid rows: anything finite, weighted 0 below
    probs = logits.masked_fill_(~visible, float("-inf")).softmax(-1)
    weight = query_ok.float() / query_ok.sum(-1, keepdim=True).clamp_min(1)
    return (weight[:, None, None, None, :] @ probs).squeeze(-2)


def pool_scores(scores: torch.Tensor, key_ok: torch.Tensor, kernel: int, mode: str) -> torch.Tensor:
    """Pool scores [B, Hkv, G, S] along the slots with an odd ``kernel`` (``max`` or ``avg``) over occupied slots.

    key_ok bool [B, S]. Empty slots take no part (so left padding changes no score); a kernel of 1 is the identity.
    """
    if kernel == 1:
        return scores
    shape = scores.shape
    ok = key_ok[:, None, None, :].expand(shape).reshape(-1, 1, shape[-1]).float()
    flat = scores.reshape(-1, 1, shape[-1])
    if mode == "max":
        flat = flat.masked_fill(ok == 0, float("-inf"))
        return F.max_pool1d(flat, kernel, stride=1, padding=kernel // 2).view(shape).clamp_min(0.0)
    total = F.avg_pool1d(flat * ok, kernel, stride=1, padding=kernel // 2)
    count = F.avg_pool1d(ok, kernel, stride=1, padding=kernel // 2)
    return (total / count.clamp_min(_EPS)).view(shape) * key_ok[:, None, None, :]


def aggregate_group(scores: torch.Tensor, mode: str) -> torch.Tensor:
    """[B, Hkv, G, S] -> [B, Hkv, S]: combine the query heads of each GQA group (``max`` or ``mean``)."""
    return scores.amax(2) if mode == "max" else scores.mean(2)


def key_redundancy(keys: torch.Tensor, key_ok: torch.Tensor) -> torch.Tensor:
    """R-KV key redundancy: mean cosine similarity of each key to the other occupied keys of its head.

    keys [B, Hkv, S, D]; key_ok bool [B, S]. Returns float32 [B, Hkv, S] (0 for empty slots).
    With unit keys u and their sum U over occupied slots, it is (u_i . U - 1) / (n - 1): O(S D), not O(S^2 D).
    """
    keys = keys.float()
    inv_norm = keys.norm(dim=-1).clamp_min(_EPS).reciprocal() * key_ok[:, None, :]  # [B, Hkv, S]
    total = inv_norm[:, :, None, :] @ keys  # [B, Hkv, 1, D]: sum of unit keys
    dots = (keys @ total.transpose(-1, -2)).squeeze(-1) * inv_norm  # u_i . U
    count = (key_ok.sum(-1) - 1).clamp_min(1)[:, None, None]
    return (dots - 1.0) * key_ok[:, None, :] / count


def normalize_max(scores: torch.Tensor, key_ok: torch.Tensor) -> torch.Tensor:
    """Divide [B, Hkv, S] scores by their maximum over the occupied slots of each (sample, head)."""
    peak = scores.masked_fill(~key_ok[:, None, :], 0.0).amax(-1, keepdim=True)
    return scores / peak.clamp_min(_EPS)


def normalize_sum(scores: torch.Tensor, key_ok: torch.Tensor) -> torch.Tensor:
    """Divide [B, Hkv, S] non-negative scores by their sum over the occupied slots of each (sample, head)."""
    scores = scores.masked_fill(~key_ok[:, None, :], 0.0)
    return scores / scores.sum(-1, keepdim=True).clamp_min(_EPS)


def merge_history(old: torch.Tensor, new: torch.Tensor, form: str, alpha: float) -> torch.Tensor:
    """G-KV global score: ``max(alpha*old, new)``, ``alpha*old + (1-alpha)*new`` or ``alpha*old + new``."""
    if form == "max":
        return torch.maximum(alpha * old, new)
    if form == "mean":
        return alpha * old + (1.0 - alpha) * new
    return alpha * old + new


def compression_scores(
    config: CompressionConfig,
    query: torch.Tensor,
    query_pos: torch.Tensor,
    query_ok: torch.Tensor,
    keys: torch.Tensor,
    key_pos: torch.Tensor,
    key_ok: torch.Tensor,
    history: torch.Tensor | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Selection score of every slot for one layer, and the updated history (methods that keep one).

    Arguments as in ``window_attention``; history float32 [B, Hkv, S] or None.
    Returns (score [B, Hkv, S], history [B, Hkv, S] or None); higher scores are kept first.
    """
    if config.method == "streaming":
        return key_pos.float(), None
    local = window_attention(query, query_pos, query_ok, keys, key_pos, key_ok, scale)
    local = aggregate_group(pool_scores(local, key_ok, config.kernel, config.pool), config.aggregation)
    if config.method == "h2o":
        history = merge_history(history, local, "sum", config.alpha)
        return history, history
    if config.method == "gkv":
        history = merge_history(history, normalize_max(local, key_ok), config.form, config.alpha)
        score = history
        if config.uses_redundancy:
            redundancy = normalize_max(key_redundancy(keys, key_ok), key_ok)
            score = config.lambda_ * score - (1.0 - config.lambda_) * redundancy
        return score, history
    if config.method == "rkv":
        redundancy = key_redundancy(keys, key_ok).masked_fill(~key_ok[:, None, :], float("-inf")).softmax(-1)
        return config.lambda_ * normalize_sum(local, key_ok) - (1.0 - config.lambda_) * redundancy, None
    return local, None  # snapkv


def select_keep(
    score: torch.Tensor, key_pos: torch.Tensor, key_ok: torch.Tensor, lengths: torch.Tensor, budget: int, window: int, sinks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots to keep: the sinks, the last ``window`` positions, then the best-scored others, ``budget`` in all.

    score float [B, Hkv, S]; key_pos int64 [B, Hkv, S]; key_ok bool [B, S]; lengths int64 [B] tokens seen so far.
    Returns (index int64 [B, Hkv, K] with K = min(budget, S), n_keep int64 [B] = min(budget, occupied slots)).
    The last ``n_keep[b]`` indices of each row are the kept slots in increasing position, after the empty ones:
    gathered in this order, every sequence's occupied slots stay one contiguous run ending at the buffer's end,
    as after left-padded prefill, so pooling along the slots never straddles a gap.
    """
    ok = key_ok[:, None, :].expand_as(score)
    forced = ok & ((key_pos >= (lengths - window)[:, None, None]) | (key_pos < sinks))
    ranked = score.float().masked_fill(forced, float("inf")).masked_fill(~ok, float("-inf"))
    k = min(budget, score.shape[-1])
    index = ranked.topk(k, dim=-1).indices
    empty_first = index + score.shape[-1] * ok.gather(-1, index)
    index = index.gather(-1, empty_first.argsort(-1))
    n_keep = key_ok.sum(-1).clamp_max(budget)
    return index, n_keep
