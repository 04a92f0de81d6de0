"""Pure functions of S4R's low-rank cache: rank, sampling, bases, RoPE, latent scores, selection.

Shapes: ``B`` batch, ``Hkv`` KV heads, ``D`` head dim, ``D' = Hkv * D`` (all KV heads of a layer side by side),
``G`` query heads per KV head, ``W`` query window, ``S`` cache slots, ``r`` rank.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gkv_train.rollout.scoring import mean_over_window, window_softmax


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
    return mean_over_window(window_softmax(z, visible, q_ok[:, None, :, None]), q_ok)


def select_tokens(
    score: torch.Tensor, k_pos: torch.Tensor, k_ok: torch.Tensor, position: torch.Tensor, count: torch.Tensor,
    window: int, rho: float, full: bool,
) -> torch.Tensor:
    """Which slots a decode step reconstructs: the last ``window`` positions (the current one included) plus the
    top k = max(floor(rho * count) - window, 0) others by score (of equal scores, the earlier slot); every
    occupied slot when ``full``.

    score [B, S]; k_pos int64 [B, S]; k_ok bool [B, S]; position int64 [B] the current query's position;
    count int64 [B] occupied slots (the cache length L_t). Returns bool [B, S].
    """
    if full:
        return k_ok.clone()
    local = k_ok & (k_pos > (position - window)[:, None])
    k = (torch.floor(rho * count.double()).long() - window).clamp_min(0)
    ranked = score.float().masked_fill(~k_ok | local, float("-inf"))
    top = min(int(k.max()), ranked.shape[-1])
    chosen = torch.zeros_like(k_ok)
    if top > 0:
        # a stable sort: equal scores (max pooling makes many) go to the earlier slot, whatever the batch's width
        values, index = ranked.sort(dim=-1, descending=True, stable=True)
        values, index = values[:, :top], index[:, :top]
        keep = (torch.arange(top, device=k.device)[None, :] < k[:, None]) & torch.isfinite(values)
        chosen.scatter_(-1, index, keep)
    return local | chosen
