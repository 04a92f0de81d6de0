"""Pure functions that score the cached tokens at a compression (G-KV family) and pick what is kept.

Shapes: ``B`` batch, ``Hkv`` KV heads, ``G`` query heads per KV head, ``W`` scoring queries, ``S`` cache
slots, ``D`` head dim. Slots hold keys in increasing logical position; ``key_ok`` marks the occupied ones.
*Candidates* are the occupied slots that a compression may evict: everything but the last ``window``
positions and each sequence's first ones (the ``sinks``, or its whole prompt with ``keep_prompt``), which are kept
unconditionally and never scored (the reference implementation removes the window's columns before pooling and
normalising).

Conventions follow the reference implementation of G-KV (microsoft/G-KV, ``ScoreBasedKV.update_kv`` and
``compute_attention_scores``); each function says which step it reproduces.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

_EPS = 1e-12
# float32 entries per chunk of the [.., S] x S matrices of a score (16 MiB): the peak a long cache's scores hold
# (S 4096, 16 rows, 3 KV heads: 3.2 GB in one call). Smaller chunks stay in a core's cache but cost a call each: at
# 16 x 512 (budget 128, window 16, interval 32) compression took 5.0 % of decode at 2**17 (about 10 calls a layer),
# 4.3 % at 2**19 and 4.1 % at 2**22 (one call a layer), 2-core CPU, 2026-12-07
SCORE_CHUNK = 2**22


@dataclass(frozen=True)
class LayerState:
    """One layer's cache at a compression: what a method may score it with.

    query [B, Hkv, G, W, D]: the last W queries (after RoPE); query_pos int64 [B, W]; query_ok bool [B, W];
    keys [B, Hkv, S, D] (after RoPE); key_pos int64 [B, Hkv, S] logical positions; key_ok bool [B, S];
    candidates bool [B, Hkv, S]: occupied slots outside the window and sinks (the only ones a score decides);
    history float32 [B, Hkv, S]: each token's global score from the last compression, NaN where it has none;
    scale: the attention scale (1 / sqrt(D)); layer: the layer's index; rows int64 [B]: each sequence's row in the
    rollout (the batch it started with); lengths int64 [B]: tokens each sequence has seen (the compression's time);
    seed: the rollout's sampling seed (for a method that draws at random).
    """

    query: torch.Tensor
    query_pos: torch.Tensor
    query_ok: torch.Tensor
    keys: torch.Tensor
    key_pos: torch.Tensor
    key_ok: torch.Tensor
    candidates: torch.Tensor
    history: torch.Tensor
    scale: float
    layer: int = 0
    rows: torch.Tensor | None = None
    lengths: torch.Tensor | None = None
    seed: int = 0


def method_path(method) -> str:
    """How messages name a method's class: ``module:Class``, as ``compression.method`` names a plug-in."""
    return f"{type(method).__module__}:{type(method).__qualname__}"


def checked_score(method, state: LayerState, history: bool | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``method.score(state)`` checked against its contract (``EvictionMethod.score``): a tuple (score, history),
    the score a floating-point tensor [B, Hkv, S] (the shape of ``state.key_pos``), the history None or a
    floating-point tensor of that shape (NaN in it: no history, as in ``state.history``); ``history``: whether
    the layers before gave one (None: this is the first layer), which every layer of a compression must do alike.
    ValueError / TypeError naming the method's class (``method_path``), ``score`` and what is wrong, also when
    ``score`` itself raises; the finiteness of the scores is ``check_finite``'s (once per compression)."""
    who = f"compression method {method_path(method)}: score(state)"
    try:
        result = method.score(state)
    except torch.OutOfMemoryError:
        raise
    except Exception as err:
        raise ValueError(f"{who} raised {type(err).__name__}: {err}") from err
    if not isinstance(result, tuple) or len(result) != 2:
        got = f"a tuple of {len(result)}" if isinstance(result, tuple) else f"a {type(result).__name__}"
        raise TypeError(f"{who} returned {got}; it returns a tuple (score [B, Hkv, S], history or None)")
    score, new_history = result
    shape = tuple(state.key_pos.shape)
    for what, value in (("score", score), ("history", new_history)):
        if what == "history" and value is None:
            continue
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{who} returned a {type(value).__name__} as its {what}; it returns a float tensor {shape}")
        if not value.is_floating_point():
            raise TypeError(f"{who} returned a {value.dtype} {what}; it returns a float tensor {shape}")
        if value.device != state.key_pos.device:
            raise ValueError(f"{who} returned its {what} on {value.device}; the cache is on {state.key_pos.device}")
        if tuple(value.shape) != shape:
            raise ValueError(
                f"{who} returned a {what} of shape {tuple(value.shape)}; it returns one of shape {shape} "
                "[B, Hkv, S], one per cache slot"
            )
    if history is not None and history != (new_history is not None):
        raise ValueError(f"{who} returned a history for some layers and None for others: one for every layer, or none")
    return score, new_history


def check_finite(method, scores: torch.Tensor, candidates: torch.Tensor) -> None:
    """ValueError naming the method when a score it gave a candidate slot is NaN or infinite: top-k would keep a NaN
    first, and ties of infinities are broken by position, not by the method. scores float [..., B, Hkv, S];
    candidates bool, the same shape (the other slots' scores are not read)."""
    bad = ~scores.isfinite() & candidates
    if bool(bad.any()):
        which = "a NaN" if bool((scores.isnan() & candidates).any()) else "an infinite"
        raise ValueError(
            f"compression method {method_path(method)}: score(state) gave {int(bad.sum())} of "
            f"{int(candidates.sum())} candidate slots {which} score; scores must be finite numbers"
        )


def candidate_slots(
    key_pos: torch.Tensor, key_ok: torch.Tensor, lengths: torch.Tensor, window: int, kept_front: int | torch.Tensor
) -> torch.Tensor:
    """Occupied slots outside the window and each sequence's kept front: bool [..., B, Hkv, S].

    key_pos int64 [..., B, Hkv, S] (leading dims: e.g. layers); key_ok bool [B, S]; lengths int64 [B] tokens
    seen (the next logical position); kept_front: the positions below it are always kept, one number for every
    sequence (the sinks) or int64 [B], one per sequence (with ``keep_prompt``: its prompt's length, at least the
    sinks).
    """
    if isinstance(kept_front, torch.Tensor):
        kept_front = kept_front[:, None, None]
    return key_ok[:, None, :] & (key_pos < (lengths - window)[:, None, None]) & (key_pos >= kept_front)


def window_softmax(logits: torch.Tensor, hidden: torch.Tensor, query_ok: torch.Tensor) -> torch.Tensor:
    """Softmax of scoring queries' logits [..., W, S] over the keys each may see; ``logits`` is overwritten.

    hidden bool, broadcastable to ``logits``: the keys a query may not see; query_ok bool, broadcastable to
    [..., W, 1]: the rows of invalid queries see every key, so they come out finite (not NaN), and must be given
    weight 0 (``mean_over_window``).
    """
    # (in place: a broadcast ``where`` or ``masked_fill`` writes a new [..., W, S] tensor, twice the time on CPU)
    return logits.masked_fill_(hidden & query_ok, float("-inf")).softmax(-1)


def mean_over_window(probs: torch.Tensor, query_ok: torch.Tensor) -> torch.Tensor:
    """probs [B, X, W, S] -> [B, X, S]: the mean over the valid scoring queries (query_ok bool [B, W])."""
    weight = query_ok.float() / query_ok.sum(-1, keepdim=True).clamp_min(1)
    return (weight[:, None, None, :] @ probs).squeeze(-2)


def aggregate_group(x: torch.Tensor, dim: int, how: str) -> torch.Tensor:
    """Combine the query heads of a GQA group along ``dim``: ``max`` (the reference) or ``mean``."""
    return x.amax(dim) if how == "max" else x.mean(dim)


def window_attention(
    query: torch.Tensor,
    query_pos: torch.Tensor,
    query_ok: torch.Tensor,
    keys: torch.Tensor,
    key_pos: torch.Tensor,
    key_ok: torch.Tensor,
    scale: float,
    group_agg: str,
) -> torch.Tensor:
    """Attention that the scoring window pays to every cached key, as the reference computes it.

    query [B, Hkv, G, W, D] (after RoPE); query_pos int64 [B, W]; query_ok bool [B, W];
    keys [B, Hkv, S, D] (after RoPE); key_pos int64 [B, Hkv, S]; key_ok bool [B, S].
    Each valid query's softmax runs causally over all occupied slots (the window's own keys included); the
    query heads of a GQA group are combined per query (``max``, the reference, or ``mean``), then the result
    is averaged over the valid window queries. Computed for a few sequences at a time (``SCORE_CHUNK`` logits:
    each sequence's scores are its own), so that the [B, Hkv, G, W, S] logits stay in cache.
    Returns float32 [B, Hkv, S].
    """
    B, Hkv, G, W, D = query.shape
    step = max(1, SCORE_CHUNK // (Hkv * G * W * keys.shape[-2]))
    if step < B:
        rows = [slice(i, i + step) for i in range(0, B, step)]
        return torch.cat(
            [
                window_attention(query[r], query_pos[r], query_ok[r], keys[r], key_pos[r], key_ok[r], scale, group_agg)
                for r in rows
            ]
        )
    scaled = query.float().reshape(B, Hkv, G * W, D) * scale
    logits = (scaled @ keys.float().transpose(-1, -2)).view(B, Hkv, G, W, -1)
    hidden = ~key_ok[:, None, None, None, :] | (key_pos[:, :, None, None, :] > query_pos[:, None, None, :, None])
    probs = window_softmax(logits, hidden, query_ok[:, None, None, :, None])  # [B, Hkv, G, W, S]
    return mean_over_window(aggregate_group(probs, 2, group_agg), query_ok)


def pool_scores(scores: torch.Tensor, ok: torch.Tensor, kernel: int, mode: str) -> torch.Tensor:
    """Pool scores [..., S] along the slots with an odd ``kernel`` (``max`` or ``avg``) over the ``ok`` slots.

    ok bool, broadcastable to ``scores``. Slots outside ``ok`` take no part (the reference pools the candidate
    region only, padded with -inf); a kernel of 1 is the identity. Scores are non-negative attention.
    ``ok=None`` with ``max``: every slot takes part (the same result where the slots outside are 0).
    """
    if kernel == 1:
        return scores
    shape = scores.shape
    if ok is None and mode == "max":
        return F.max_pool1d(scores.reshape(-1, 1, shape[-1]), kernel, stride=1, padding=kernel // 2).view(shape)
    ok = ok.expand(shape).reshape(-1, 1, shape[-1]).float()
    flat = scores.reshape(-1, 1, shape[-1])
    if mode == "max":
        flat = flat.masked_fill(ok == 0, float("-inf"))
        return F.max_pool1d(flat, kernel, stride=1, padding=kernel // 2).view(shape).clamp_min(0.0)
    total = F.avg_pool1d(flat * ok, kernel, stride=1, padding=kernel // 2)
    count = F.avg_pool1d(ok, kernel, stride=1, padding=kernel // 2)
    return (total / count.clamp_min(_EPS)).view(shape) * ok.view(shape)


def unit_keys(keys: torch.Tensor, key_ok: torch.Tensor) -> torch.Tensor:
    """keys [..., S, D] / (their norm + 1e-6), float32; key_ok bool [..., S] (broadcast): empty slots get a zero
    unit key, so that every cosine with them is exactly 0 (whatever the slot holds)."""
    keys = keys.float()
    # filled in place (a broadcast ``where`` writes another [..., S, D] tensor)
    return (keys / (keys.norm(dim=-1, keepdim=True) + 1e-6)).masked_fill_(~key_ok[..., None], 0.0)


def near_duplicate_sums(unit: torch.Tensor, threshold: float) -> torch.Tensor:
    """``similarity_sums``' ``rkv`` kernel over unit keys [N, S, D] (N heads): float32 [N, S]."""
    S = unit.shape[-2]
    cos = unit @ unit.transpose(-1, -2)  # [N, S(m), S(n)]
    cos.diagonal(dim1=-2, dim2=-1).zero_()
    # for every key n, the most recent other key m with cos > threshold (-1: none), as the largest m + 1 of the
    # 0/1 mask times m + 1 (much faster on CPU than an argmax or an int64 index tensor over S x S); the mask in
    # float32, which CPU kernels compare into and multiply twice as fast as into a bool or small-integer tensor
    order = torch.arange(1, S + 1, dtype=torch.float32, device=unit.device)[:, None]  # exact below 2^24
    latest = torch.gt(cos, threshold, out=torch.empty_like(cos)).mul_(order).amax(-2).long() - 1  # [N, S(n)]
    at = latest.clamp_min(0)[:, None, :]
    dropped = torch.where(latest >= 0, 0.0, cos.gather(-2, at).squeeze(-2))
    cos.scatter_(-2, at, dropped[:, None, :])  # that entry counts 0
    return cos.sum(-1)


def similarity_sums(keys: torch.Tensor, key_ok: torch.Tensor, kind: str, threshold: float = 0.5) -> torch.Tensor:
    """Sum of each key's cosine similarity to the other occupied keys of its head: float32 [B, Hkv, S].

    keys [B, Hkv, S, D]; key_ok bool [B, S]. ``kind``:
    ``rkv`` (the reference's kernel, O(S^2 D)): cosines u_m . u_n with u = k / (|k| + 1e-6), self excluded;
        for every key n, the entry of the most recent other key m with cos > ``threshold`` is dropped (so a
        key's latest near-duplicate does not count against it); computed for a few heads at a time
        (``SCORE_CHUNK`` cosines: each head's sums are its own, so the chunks give what one call would),
        so that the S x S matrices are written and read again in cache, not in memory;
    ``mean_cosine`` (O(S D)): all other keys, nothing dropped: u_m . U - |u_m|^2 with U the sum of unit keys.
    Empty slots give 0.
    """
    B, Hkv, S, D = keys.shape
    if kind == "mean_cosine":
        unit = unit_keys(keys, key_ok[:, None, :])
        total = unit.sum(-2, keepdim=True)  # [B, Hkv, 1, D]
        return (unit @ total.transpose(-1, -2)).squeeze(-1) - unit.square().sum(-1)
    heads, ok = keys.reshape(B * Hkv, S, D), key_ok[:, None, :].expand(B, Hkv, S).reshape(B * Hkv, S)
    step = max(1, SCORE_CHUNK // (S * S))
    sums = [
        near_duplicate_sums(unit_keys(heads[i : i + step], ok[i : i + step]), threshold)
        for i in range(0, B * Hkv, step)
    ]
    return torch.cat(sums).view(B, Hkv, S)


def key_redundancy(keys: torch.Tensor, key_ok: torch.Tensor, kind: str) -> torch.Tensor:
    """R-KV key redundancy as the reference computes it: softmax over the occupied keys of
    ``similarity_sums / n`` (n = occupied keys). keys [B, Hkv, S, D]; key_ok bool [B, S]. Returns float32
    [B, Hkv, S], 0 on empty slots; the softmax runs over the window's keys too."""
    count = key_ok.sum(-1).clamp_min(1)[:, None, None]
    logits = (similarity_sums(keys, key_ok, kind) / count).masked_fill_(~key_ok[:, None, :], float("-inf"))
    return logits.softmax(-1).nan_to_num_(0.0)


def normalize_max(scores: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Divide non-negative scores [B, Hkv, S] by their maximum over each (sample, head)'s candidate slots."""
    peak = scores.masked_fill(~candidates, 0.0).amax(-1, keepdim=True)
    return scores / peak.clamp_min(_EPS)


def merge_history(old: torch.Tensor, new: torch.Tensor, form: str, alpha: float) -> torch.Tensor:
    """G-KV global score of [B, Hkv, S] scores: ``max(alpha*old, new)``, ``alpha*old + (1-alpha)*new`` or
    ``alpha*old + new`` (forms max / mean / sum). ``old`` is NaN where a token has no history (it arrived
    since the last compression, or was in the window then): such a token scores ``new``, as in the reference
    (which blends it as old = new, or old = 0 for the sum form)."""
    if form == "max":
        merged = torch.maximum(alpha * old, new)
    elif form == "mean":
        merged = alpha * old + (1.0 - alpha) * new
    else:
        merged = alpha * old + new
    return torch.where(old.isnan(), new, merged)


_MASK32 = 0xFFFFFFFF


def _mix32(x):
    """A 32-bit integer hash of values in [0, 2^32), an int or an int64 tensor (two xor-shift-multiply rounds;
    the products stay below 2^63, so int64 arithmetic never overflows on any device)."""
    for _ in range(2):
        x = (((x >> 16) ^ x) * 0x45D9F3B) & _MASK32
    return (x >> 16) ^ x


def hashed_uniform(seed: int, *coordinates: torch.Tensor) -> torch.Tensor:
    """Uniform draws in [0, 1), a pure function of ``seed`` and the integer ``coordinates`` (int64 tensors
    broadcast together): float32 of the broadcast shape, 24 random bits each. The same coordinates give the same
    draw whatever the batch, its padding or the device."""
    h = _mix32(seed & _MASK32)
    for c in coordinates:
        h = _mix32((c & _MASK32) ^ h)
    return (h >> 8).float() * 2.0**-24


def select_keep(
    score: torch.Tensor, candidates: torch.Tensor, key_ok: torch.Tensor, budget: int, window: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots to keep: every occupied non-candidate slot (window, sinks or the kept prompt), then the best-scored
    candidates, ``budget`` in all (the non-candidates of a sequence over budget must fit in ``budget - window``
    besides the window: ``EvictionMethod.check_kept_prompt``).

    score float [..., B, Hkv, S] (leading dims: e.g. layers); candidates bool, the same shape; key_ok bool [B, S].
    Every sequence appends a token per step, so its newest ``window`` tokens fill the buffer's last ``window``
    slots: those are kept, and the others are ranked by one ``topk`` over the slots before them, as the
    reference ranks its cache without the window (the same call, so that tied scores, common after max pooling,
    are broken the same way); a shorter row of a padded batch is ranked over its own slots, so that ties are
    broken as when it is ranked alone.
    Returns (index int64 [..., B, Hkv, K] with K = min(budget, S), n_keep int64 [B] = min(budget, occupied slots)).
    The last ``n_keep[b]`` indices of each row are the kept slots in increasing position, after the empty ones:
    gathered in this order, every sequence's occupied slots stay one contiguous run ending at the buffer's end,
    as after left-padded prefill, so pooling along the slots never straddles a gap.
    """
    S = score.shape[-1]
    ok = key_ok[:, None, :].expand_as(score)
    ranked = score.float().masked_fill(ok & ~candidates, float("inf")).masked_fill(~ok, float("-inf"))
    room = min(budget, S) - window
    best = ranked[..., : S - window].topk(room, dim=-1).indices
    # ``topk`` breaks ties depending on the whole row it ranks. A row with empty leading slots (a shorter, padded
    # sequence) that must drop some of its tokens is ranked over its own slots only, as it is ranked alone (and as
    # the reference ranks its unpadded cache): what a sequence keeps does not depend on padding or on the batch.
    occupied = key_ok.sum(-1)
    for b in ((occupied > budget) & (occupied < S)).nonzero().flatten().tolist():
        start = S - int(occupied[b])
        best[..., b, :, :] = ranked[..., b, :, start : S - window].topk(room, dim=-1).indices + start
    newest = torch.arange(S - window, S, device=score.device).expand(*best.shape[:-1], window)
    index = torch.cat([best, newest], dim=-1)
    empty_first = index + S * ok.gather(-1, index)
    index = index.gather(-1, empty_first.argsort(-1))
    n_keep = key_ok.sum(-1).clamp_max(budget)
    return index, n_keep
