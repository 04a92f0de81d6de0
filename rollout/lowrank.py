"""Pure functions of S4R's low-rank cache: rank, sampling, bases, latent scores, selection.

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


def latent_probs(
    cq: torch.Tensor, q_pos: torch.Tensor, q_ok: torch.Tensor, ck: torch.Tensor, k_pos: torch.Tensor,
    k_ok: torch.Tensor, rank: torch.Tensor,
) -> torch.Tensor:
    """Each query's causal softmax over the cache in the latent space, softmax(C_Q C_K^T / sqrt(r)).

    cq [B, G, Q, r]; q_pos int64 [B, Q]; q_ok bool [B, Q]; ck [B, S, r]; k_pos int64 [B, S]; k_ok bool [B, S];
    rank [B] each sequence's rank. Returns float32 [B, G, Q, S], the rows of invalid queries 0.
    A key's probability under a query never changes once written (later keys are hidden from it), so the
    window's sum of them moves by one query in and one out per step (``S4RCache``).
    """
    B, G, Q, r = cq.shape
    scaled = cq.float() * rank.float().rsqrt()[:, None, None, None]
    logits = (scaled.reshape(B, G * Q, r) @ ck.float().transpose(-1, -2)).view(B, G, Q, -1)
    visible = (k_ok[:, None, :] & (k_pos[:, None, :] <= q_pos[:, :, None])) | ~q_ok[:, :, None]  # finite rows
    return logits.masked_fill_(~visible[:, None], float("-inf")).softmax(-1) * q_ok[:, None, :, None]


def selection_budget(
    k_pos: torch.Tensor, k_ok: torch.Tensor, position: torch.Tensor, window: int, rho: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a decode step reconstructs besides its choice, the same for every layer: (local bool [B, S], the
    last ``window`` positions, the current one included; excluded bool [B, S], the slots not to choose from
    (empty or local); k int64 [B] = max(floor(rho * L_t) - window, 0) other slots to choose by score, L_t the
    occupied slots, at most the slots there are to choose from).

    k_pos int64 [B, S]; k_ok bool [B, S]; position int64 [B] the current query's position.
    """
    local = k_ok & (k_pos > (position - window)[:, None])
    excluded = ~k_ok | local
    k = (torch.floor(rho * k_ok.sum(-1).double()).long() - window).clamp(min=0)
    return local, excluded, torch.minimum(k, (~excluded).sum(-1))


def select_tokens(score: torch.Tensor, local: torch.Tensor, excluded: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Which slots a decode step reconstructs: the ``local`` ones plus the top ``k`` of the others by score (of
    equal scores, the earlier slot, as a stable descending sort orders them).

    score [B, S] finite; local, excluded bool [B, S], k int64 [B] (``selection_budget``). Returns bool [B, S].
    """
    ranked = score.float().masked_fill(excluded, float("-inf"))
    top = int(k.max())
    if top == 0:
        return local.clone()
    # the k-th best score of each row; everything above it is chosen, and of the slots tied with it the earliest
    # ones (max pooling makes many ties), so the choice does not depend on topk's order among equals; a row
    # with k = 0 takes nothing (nothing lies above its best, and it takes 0 of the tied ones)
    kth = ranked.topk(top, dim=-1).values.gather(-1, (k.clamp_min(1) - 1)[:, None])  # [B, 1]
    above = ranked > kth
    tied = ranked == kth
    return local | above | (tied & (tied.cumsum(-1) <= k[:, None] - above.sum(-1, keepdim=True)))


def chosen_in_order(chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The chosen slots of bool chosen [B, S] in increasing order: (order int64 [B, n], picked bool [B, n]) with n
    the most any row chose; a row that chose fewer is padded with slot 0, not picked."""
    B, S = chosen.shape
    count = chosen.sum(-1)
    n = int(count.max())
    place = torch.where(chosen, chosen.cumsum(-1) - 1, n)  # each chosen slot's place; the others go to column n
    order = torch.zeros(B, n + 1, dtype=torch.long, device=chosen.device)
    order.scatter_(-1, place, torch.arange(S, device=chosen.device).expand(B, -1))
    return order[:, :n], torch.arange(n, device=chosen.device)[None, :] < count[:, None]
