"""Pure functions of S4R's low-rank cache: rank, sampling, bases, latent scores, selection.

Shapes: ``B`` batch, ``Hkv`` KV heads, ``D`` head dim, ``D' = Hkv * D`` (all KV heads of a layer side by side),
``G`` query heads per KV head, ``W`` query window, ``S`` cache slots, ``r`` rank.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F


def s4r_rank(eta: float, sinks: int, length: int, dim: int, groups: int, window: int) -> int:
    """The rank r that makes the persistent memory a share ``eta`` of the full cache at ``length`` tokens:
    (s D' + L r + G W r / 2 + D' r) / ((s + L) D') = eta, floored, within [1, D'] (a job refuses an eta below
    rank 1's share before any work: ``check_eta``)."""
    r = (eta * (sinks + length) * dim - sinks * dim) / (length + 0.5 * groups * window + dim)
    return max(1, min(dim, math.floor(r)))


def check_eta(eta: float, sinks: int, length: int, dim: int, groups: int, window: int) -> None:
    """ValueError when ``eta`` is below the share S4R's smallest state (exact sinks, rank 1) takes of the full
    cache at ``length`` tokens after the sinks: its rank would be raised to 1 and the memory be more than asked."""
    least = (sinks * dim + length + 0.5 * groups * window + dim) / ((sinks + length) * dim)
    if eta < least:
        raise ValueError(
            f"compression.eta={eta:g} is below what S4R's smallest state (the {sinks} exact sinks and rank "
            f"1) takes of the full cache at {sinks + length} tokens, {least:.3g}: at least that, or a longer "
            "expected_length"
        )


def split_rank(rank: int, ratio: float, limit: int) -> tuple[int, int]:
    """The key and value ranks (r_k, r_v) that share the coefficients of rank ``rank``, r_k + r_v = 2 rank, with
    r_v / r_k as close to ``ratio`` as integers allow, each within [1, ``limit``] (D': a rank beyond it is cut, so
    the sum is then below 2 rank); ratio 1 gives (rank, rank)."""
    if rank == 1:
        return 1, 1
    value = min(max(round(2 * rank * ratio / (1 + ratio)), 1), 2 * rank - 1, limit)
    return min(2 * rank - value, limit), value


def persistent_elements(
    sinks: int, length: int, dim: int, groups: int, window: int, rank_k: int, rank_v: int, recent: int = 0
) -> int:
    """Numbers an S4R layer stores for one sequence: exact sink keys and values, key and value coefficients
    of every other token, the projected query window, the two bases, and (with ``refresh``) the ``recent``
    tokens' keys and values kept for the next refresh. With r_k = r_v = r and no refresh this is twice the
    numerator of ``s4r_rank``'s equation."""
    return (
        2 * sinks * dim
        + length * (rank_k + rank_v)
        + groups * window * rank_k
        + dim * (rank_k + rank_v)
        + 2 * recent * dim
    )


def extend_bases(bases: torch.Tensor, rank: int, samples: torch.Tensor, k: int, normalize: bool) -> torch.Tensor:
    """Bases [D', R] (orthonormal columns up to ``rank``, zero after) with columns rank..rank+k set to the
    leading directions of what the first ``rank`` miss of samples [n, D'] (n >= k; each row scaled to unit length
    first when ``normalize``): the top right singular vectors of the residual X - X B B^T, made orthonormal to B
    and to each other. A copy; the first ``rank`` columns are unchanged, so coefficients on them stay valid."""
    x = F.normalize(samples.float(), dim=-1) if normalize else samples.float()
    b = bases[:, :rank].float()
    residual = x - (x @ b) @ b.T
    _, _, vh = torch.linalg.svd(residual, full_matrices=False)
    new = vh[:k].T  # [D', k]
    new = new - b @ (b.T @ new)  # orthogonal to B up to rounding, exactly so after one more pass
    new, _ = torch.linalg.qr(new - b @ (b.T @ new))
    out = bases.clone()
    out[:, rank : rank + k] = new.to(bases.dtype)
    return out


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
    _, _, vh = torch.linalg.svd(x, full_matrices=x.shape[-2] < rank)  # the full V only when it must complete
    return vh[:, :rank].transpose(-1, -2)


def hidden_keys(q_pos: torch.Tensor, q_ok: torch.Tensor, k_pos: torch.Tensor, k_ok: torch.Tensor) -> torch.Tensor:
    """The keys each query may not see: bool [B, 1, Q, S], later positions and empty slots (an invalid query sees
    every key, so that its softmax stays finite; it must be given weight 0).

    q_pos int64 [B, Q]; q_ok bool [B, Q]; k_pos int64 [B, S]; k_ok bool [B, S].
    """
    return (~(k_ok[:, None, :] & (k_pos[:, None, :] <= q_pos[:, :, None])) & q_ok[:, :, None])[:, None]


def key_bias(hidden: torch.Tensor, groups: int) -> torch.Tensor:
    """The additive form of ``hidden_keys`` for ``latent_probs``: float32 [B, groups * Q, S], -inf where a key is
    hidden, 0 elsewhere (a decode step builds it once for all its layers). hidden bool [B, 1, Q, S]."""
    B, _, Q, S = hidden.shape
    bias = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device).masked_fill_(hidden, float("-inf"))
    return bias.expand(B, groups, Q, S).reshape(B, groups * Q, S)


def latent_probs(cq: torch.Tensor, ck: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Each query's causal softmax over the cache in the latent space, softmax(C_Q C_K^T / sqrt(r)).

    cq [B, G, Q, r]; ck [B, S, r]; scale float32 [B, 1, 1, 1] = r^-1/2 of each sequence's rank; bias float32
    [B, G * Q, S] (``key_bias``: -inf on the keys a query may not see), added inside the matrix product (one pass
    over the logits fewer than a mask applied after it). Returns float32 [B, G, Q, S].
    A key's probability under a query never changes once written (later keys are hidden from it), so the
    window's sum of them moves by one query in and one out per step (``S4RCache``).
    """
    B, G, Q, r = cq.shape
    logits = torch.baddbmm(bias, (cq.float() * scale).reshape(B, G * Q, r), ck.float().transpose(-1, -2))
    return logits.view(B, G, Q, -1).softmax(-1)


class SelectionBudget(NamedTuple):
    """What a decode step reconstructs besides its choice by score, the same for every layer."""

    local: torch.Tensor  # bool [B, S] the last ``window`` positions, the current one included
    excluded: torch.Tensor  # bool [B, S] the slots not to choose from (empty or local)
    k: torch.Tensor  # int64 [B] how many of the others to choose by score
    top: int  # the most any row chooses
    count: torch.Tensor  # int64 [B] slots reconstructed in all (local + k)
    n: int  # the most any row reconstructs
    same_k: bool  # every row chooses ``top``: its k-th best is the least of an unsorted top k


def selection_budget(
    k_pos: torch.Tensor, k_ok: torch.Tensor, position: torch.Tensor, window: int, rho: float
) -> SelectionBudget:
    """The last ``window`` positions are reconstructed, and k = max(floor(rho * L_t) - window, 0) others chosen by
    score, L_t the occupied slots (at most as many as there are to choose from).

    k_pos int64 [B, S]; k_ok bool [B, S]; position int64 [B] the current query's position.
    """
    local = k_ok & (k_pos > (position - window)[:, None])
    excluded = ~k_ok | local
    k = (torch.floor(rho * k_ok.sum(-1).double()).long() - window).clamp(min=0)
    k = torch.minimum(k, (~excluded).sum(-1))
    count = local.sum(-1) + k
    top = int(k.max())
    return SelectionBudget(local, excluded, k, top, count, int(count.max()), bool((k == top).all()))


def select_tokens(score: torch.Tensor, budget: SelectionBudget) -> torch.Tensor:
    """Which slots a decode step reconstructs: the ``local`` ones plus the top ``k`` of the others by score (of
    equal scores, the earlier slot, as a stable descending sort orders them); ``count`` in all.

    score [B, S] finite; budget from ``selection_budget``. Returns bool [B, S].
    """
    local, k = budget.local, budget.k
    if budget.top == 0:
        return local.clone()
    ranked = score.float().masked_fill(budget.excluded, float("-inf"))
    # the k-th best score of each row; everything above it is chosen, and of the slots tied with it the earliest
    # ones (max pooling makes many ties), so the choice does not depend on topk's order among equals; a row
    # with k = 0 takes nothing (nothing lies above its best, and it takes 0 of the tied ones)
    if budget.same_k:  # the same set of values, no sort needed
        kth = ranked.topk(budget.top, dim=-1, sorted=False).values.amin(-1, keepdim=True)  # [B, 1]
    else:
        kth = ranked.topk(budget.top, dim=-1).values.gather(-1, (k.clamp_min(1) - 1)[:, None])
    above = ranked > kth
    tied = ranked == kth
    return local | above | (tied & (tied.cumsum(-1) <= k[:, None] - above.sum(-1, keepdim=True)))


def chosen_in_order(chosen: torch.Tensor, n: int) -> torch.Tensor:
    """The chosen slots of bool chosen [B, S] in increasing order: int64 [B, n], n at least the most any row
    chose; a row that chose fewer is padded with slot 0."""
    B, S = chosen.shape
    place = torch.where(chosen, chosen.cumsum(-1) - 1, n)  # each chosen slot's place; the others go to column n
    order = torch.zeros(B, n + 1, dtype=torch.long, device=chosen.device)
    return order.scatter_(-1, place, torch.arange(S, device=chosen.device).expand(B, -1))[:, :n]
