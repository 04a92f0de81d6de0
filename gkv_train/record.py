"""The eviction record: what every generated token could see, per layer and KV head.

Format (G-KV family). For a batch of ``B`` sequences, a model with ``L`` layers and ``Hkv`` KV heads:

    evict_at: int32 [B, L, Hkv, T]

``evict_at[b, l, h, k]`` is the *logical* position of the first query that can no longer see the key at
logical position ``k`` in layer ``l``, KV head ``h`` of sequence ``b``; ``NEVER`` if no query ever loses it.
Logical positions count the real tokens of a sequence from 0 (left padding excluded), so the record does not
depend on how a batch is padded, and RoPE positions never shift when tokens are evicted.

A key ``k`` is visible to a query ``q`` iff ``k <= q < evict_at[..., k]``. Entries at positions past a
sequence's end are meaningless and ignored.

Timing (shared by the rollout engine and the masks): a compression runs *after* the forward pass of the token
that triggers it, so that token's own attention still used the uncompressed cache; the evicted keys are stamped
with the position of the next query. After prefill of a prompt of ``P`` tokens the stamp is ``P``; after the
forward of the ``n``-th generated token it is ``P + n``.
"""

from __future__ import annotations

import torch

NEVER = torch.iinfo(torch.int32).max


def after_end_is_never(evict_at: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Canonical form of a record: evictions stamped after a sequence's last token (which no query of the
    sequence observes: they come from decoding past its end in a batch) become ``NEVER``.

    evict_at int32 [B, L, Hkv, T]; lengths int64 [B] real tokens per sequence. Returns a new contiguous tensor.
    """
    last = (lengths - 1).to(evict_at.dtype)[:, None, None, None]
    return torch.where(evict_at > last, NEVER, evict_at).contiguous()


def logical_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Logical position of every column of a padded batch.

    attention_mask: [B, T] (1 for real tokens, 0 for padding, any padding side).
    Returns int64 [B, T]: the number of real tokens before each column; padding columns get 0.
    """
    mask = attention_mask.long()
    return ((mask.cumsum(-1) - 1) * mask).clamp_min(0)


def record_to_columns(evict_at: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Re-index a record from logical positions to the columns of a padded batch.

    evict_at: int32 [B, L, Hkv, T_rec] (logical key positions);
    positions: int64 [B, T] logical position of each column (``logical_positions``).
    Returns int32 [B, L, Hkv, T]: the eviction stamp of the key held by each column.
    """
    B, L, H, T_rec = evict_at.shape
    if int(positions.max()) >= T_rec:
        raise ValueError(f"record covers {T_rec} positions but the batch has sequences of {int(positions.max()) + 1}")
    index = positions[:, None, None, :].expand(B, L, H, positions.shape[-1])
    return evict_at.gather(-1, index)


def causal_mask(key_positions: torch.Tensor, key_valid: torch.Tensor, query_positions: torch.Tensor) -> torch.Tensor:
    """Causal + padding mask in logical positions.

    key_positions: int64 [B, K]; key_valid: bool [B, K] (False for padding); query_positions: int64 [B, Q].
    Returns bool [B, 1, Q, K]. A padding query has logical position 0 and so sees the first real token: no
    row is empty, so SDPA never produces NaN for it (its output is ignored).
    """
    mask = key_valid[:, None, :] & (key_positions[:, None, :] <= query_positions[:, :, None])
    return mask[:, None]


def visibility_mask(
    evict_cols: torch.Tensor, key_positions: torch.Tensor, key_valid: torch.Tensor, query_positions: torch.Tensor
) -> torch.Tensor:
    """Attention mask of one layer under the record: causal, padding and eviction.

    evict_cols: int32 [B, Hkv, K] eviction stamp of the key in each key column (one layer of
    ``record_to_columns``); key_positions: int64 [B, K]; key_valid: bool [B, K]; query_positions: int64 [B, Q].
    Returns bool [B, Hkv, Q, K]: True where the query may attend to the key.
    """
    alive = evict_cols[:, :, None, :] > query_positions[:, None, :, None]
    return alive & causal_mask(key_positions, key_valid, query_positions)


def visible_counts(evict_at: torch.Tensor, query_positions: torch.Tensor) -> torch.Tensor:
    """Number of keys each (layer, KV head) holds when a query is processed, the query itself included.

    evict_at: int32 [B, L, Hkv, T]; query_positions: int64 [B] one logical query position per sequence.
    Returns int64 [B, L, Hkv].
    """
    T = evict_at.shape[-1]
    keys = torch.arange(T, device=evict_at.device)
    q = query_positions[:, None, None, None]
    return ((keys <= q) & (evict_at > q)).sum(-1)


def retention(evict_at: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Token retention of each sequence: cache length / sequence length at its last token, mean over layers and heads.

    evict_at: int32 [B, L, Hkv, T]; lengths: int64 [B] real tokens per sequence (prompt + completion).
    Returns float32 [B] in (0, 1].
    """
    counts = visible_counts(evict_at, lengths - 1).float().mean(dim=(1, 2))
    return counts / lengths.float()
