"""The eviction record of the G-KV family: what every generated token could see, per layer and KV head.

Format. For a batch of ``B`` sequences, a model with ``L`` layers and ``Hkv`` KV heads:

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

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gkv_rollout.contract.attention import masked_attention, seen_columns
from gkv_rollout.contract.record import batch_rows, causal_mask, logical_positions

NEVER = torch.iinfo(torch.int32).max


def after_end_is_never(evict_at: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Canonical form of a record: evictions stamped after a sequence's last token (which no query of the
    sequence observes: they come from decoding past its end in a batch) become ``NEVER``.

    evict_at int32 [B, L, Hkv, T]; lengths int64 [B] real tokens per sequence. Returns a new contiguous tensor.
    """
    last = (lengths - 1).to(evict_at.dtype)[:, None, None, None]
    return torch.where(evict_at > last, NEVER, evict_at).contiguous()


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


def visibility_mask(
    evict_cols: torch.Tensor, key_positions: torch.Tensor, key_valid: torch.Tensor, query_positions: torch.Tensor
) -> torch.Tensor:
    """Attention mask of one layer under the record: causal, padding and eviction.

    evict_cols: int32 [B, Hkv, K] eviction stamp of the key in each key column (one layer of
    ``record_to_columns``); key_positions: int64 [B, K]; key_valid: bool [B, K] (or both [B, Hkv, K]: each KV
    head's own columns); query_positions: int64 [B, Q].
    Returns bool [B, Hkv, Q, K]: True where the query may attend to the key.
    """
    alive = evict_cols[:, :, None, :] > query_positions[:, None, :, None]
    if key_positions.dim() == 2:
        return alive & causal_mask(key_positions, key_valid, query_positions)
    return alive & key_valid[:, :, None, :] & (key_positions[:, :, None, :] <= query_positions[:, None, :, None])


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


BLOCK = 128  # FlexAttention's block (query and key) size


def block_classes(
    evict: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor, num_queries: int, block: int = BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which (query block, key block) tiles of one layer's mask are full (every query sees every key) and which
    partial (some see some), from block-wise summaries of the record instead of the mask evaluated everywhere.

    evict: int32 [B, Hkv, T] eviction stamp of each key column (one layer of ``record_to_columns``); positions:
    int64 [B, T]; valid: bool [B, T]; the queries are the last ``num_queries`` columns. Returns (full, partial),
    bool [B, Hkv, Q blocks, K blocks]; a tile in neither is empty.

    A key k is visible to a query at position q iff valid[k], pos[k] <= q < evict[k]. Per key block: whether every
    column is a real key, the largest and smallest real key position and eviction stamp; per query block: its
    smallest and largest query position (both among its queries). A tile is full iff every key is real, every
    query of the block is (the last, ragged block never is), the latest key is written by the first query and the
    earliest eviction comes after the last query; empty when no key is real, every key is written after the last
    query, or every key left by the first query's; a tile whose keys all come at or before its first query is
    partial otherwise (the longest-lived key is seen by the first query). The remaining tiles (a key block that
    reaches past the first query: the diagonal, and query blocks holding padding, which sits at position 0) are
    decided by evaluating the mask on them alone.
    """
    B, H, T = evict.shape
    nk, nq, offset = -(-T // block), -(-num_queries // block), T - num_queries
    pad = nk * block - T
    big, small = torch.iinfo(torch.int64).max, -1
    kv = F.pad(valid, (0, pad), value=False).view(B, 1, nk, block)
    kp = F.pad(positions, (0, pad)).view(B, 1, nk, block)
    ke = F.pad(evict.long(), (0, pad)).view(B, H, nk, block)
    all_real, any_real = kv.all(-1), kv.any(-1)  # [B, 1, nk]
    last_key = torch.where(kv, kp, small).amax(-1)[:, :, None, :]  # [B, 1, 1, nk]
    first_key = torch.where(kv, kp, big).amin(-1)[:, :, None, :]
    first_evict = torch.where(kv, ke, big).amin(-1)[:, :, None, :]  # [B, H, 1, nk]
    last_evict = torch.where(kv, ke, small).amax(-1)[:, :, None, :]
    qpad = nq * block - num_queries
    qp = F.pad(positions[:, offset:], (0, qpad)).view(B, 1, nq, block)
    qin = F.pad(torch.ones(num_queries, dtype=torch.bool, device=evict.device), (0, qpad)).view(1, 1, nq, block)
    first_query = torch.where(qin, qp, big).amin(-1)[..., None]  # [B, 1, nq, 1]
    last_query = torch.where(qin, qp, small).amax(-1)[..., None]
    # a ragged last query block is never full, as in ``create_block_mask`` (which pads the mask with False)
    all_queries = qin.all(-1)[..., None]  # [1, 1, nq, 1]
    full = all_real[:, :, None, :] & all_queries & (last_key <= first_query) & (first_evict > last_query)
    below = last_key <= first_query
    partial = below & ~full & (last_evict > first_query)
    empty = ~any_real[:, :, None, :] | (first_key > last_query) | (last_evict <= first_query)
    undecided = (~below & ~empty).expand(B, H, nq, nk).nonzero()  # [N, 4]: b, h, i, j
    for chunk in undecided.split(1024):
        b, h, i, j = chunk.unbind(-1)
        keys = j[:, None] * block + torch.arange(block, device=evict.device)  # [N, block] padded key columns
        queries = i[:, None] * block + torch.arange(block, device=evict.device)
        kpos, kreal, kevict = (
            kp.view(B, -1)[b[:, None], keys],
            kv.view(B, -1)[b[:, None], keys],
            ke.view(B, H, -1)[b[:, None], h[:, None], keys],
        )
        qpos, qreal = qp.view(B, -1)[b[:, None], queries], qin.view(-1)[queries]
        seen = (
            kreal[:, None, :]
            & (kpos[:, None, :] <= qpos[:, :, None])
            & (kevict[:, None, :] > qpos[:, :, None])
            & qreal[:, :, None]
        )
        partial[b, h, i, j] = seen.flatten(1).any(-1)
    return full.expand(B, H, nq, nk), partial


def block_lists(tiles: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A BlockMask's (num_blocks int32 [B, H, nq], indices int32 [B, H, nq, nk]) from the tiles of each KV head
    (bool [B, Hkv, nq, nk]), each KV head's lists taken by its ``groups`` query heads (by index)."""
    heads = torch.arange(tiles.shape[1] * groups, device=tiles.device) // groups
    tiles = tiles.index_select(1, heads)
    order = torch.sort((~tiles).to(torch.int8), dim=-1, stable=True).indices  # the tiles first, in key order
    return tiles.sum(-1, dtype=torch.int32), order.to(torch.int32)


def block_sets(mask) -> tuple[list, list]:
    """A FlexAttention BlockMask's partial and full key blocks of every (row, head, query block), as sorted lists:
    two masks with equal sets attend alike, whatever order their index lists hold."""

    def sets(num, index):
        B, H, nq = num.shape
        return [
            [[sorted(index[b, h, i, : num[b, h, i]].tolist()) for i in range(nq)] for h in range(H)] for b in range(B)
        ]

    return sets(mask.kv_num_blocks, mask.kv_indices), sets(mask.full_kv_num_blocks, mask.full_kv_indices)


BACKENDS = ("auto", "sdpa", "flex")


def resolved_backend(backend: str, cuda: bool) -> str:
    """The mask backend an eviction record's forward uses: ``auto`` is FlexAttention on CUDA, SDPA elsewhere."""
    return ("flex" if cuda else "sdpa") if backend == "auto" else backend


@dataclass
class EvictionMasks:
    """Attention context (``gkv_rollout.contract.attention``) of a forward over a padded batch under an eviction
    record. Every layer builds its own mask from its slice of the record when it runs, so no [B, L, T, T] tensor
    is ever held: on CPU a dense boolean mask for SDPA; with ``backend="flex"`` (default on CUDA) a FlexAttention
    ``BlockMask`` whose mask function reads the record directly.

    evict_cols: int32 [B, L, Hkv, T] eviction stamp of the key in each column, per layer and KV head;
    positions: int64 [B, T] logical position of each column; valid: bool [B, T] real (non-padding) columns.
    """

    evict_cols: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor
    backend: str = "auto"

    @classmethod
    def build(cls, evict_at: torch.Tensor, attention_mask: torch.Tensor, backend: str = "auto") -> "EvictionMasks":
        """evict_at: int32 [B, L, Hkv, T_rec] record; attention_mask: [B, T] padding mask of the batch."""
        if backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}; choose one of {BACKENDS}")
        if evict_at.shape[0] != attention_mask.shape[0]:
            raise ValueError(f"record has {evict_at.shape[0]} rows but the batch has {attention_mask.shape[0]}")
        positions = logical_positions(attention_mask)
        evict_cols = record_to_columns(evict_at.to(attention_mask.device), positions)
        return cls(evict_cols, positions, attention_mask.bool(), backend)

    def evicts_nothing(self) -> bool:
        """Whether every query sees every real key up to its own position, in every layer and KV head: each real
        key's stamp comes after its row's last query (a record of rows that never went over the budget). Plain
        causal attention then reproduces the record exactly. One host sync (on CUDA)."""
        last = torch.where(self.valid, self.positions, -1).amax(-1)  # [B] each row's last query position
        alive = self.evict_cols > last[:, None, None, None].to(self.evict_cols.dtype)  # [B, L, Hkv, T]
        return bool((alive | ~self.valid[:, None, None, :]).all())

    def layer_mask(
        self, layer_idx: int, num_queries: int, start: int = 0, end: int | None = None, columns=slice(None)
    ) -> torch.Tensor:
        """Dense bool mask [B, Hkv, Q, n] of one layer for the last ``num_queries`` columns (their rows
        start:end only: Q = end - start) over the key ``columns`` (a slice, or int64 [B, Hkv, n] per KV head:
        ``seen_columns``; all T by default)."""
        queries = self.positions[:, -num_queries:][:, start:end]
        evict = self.evict_cols[:, layer_idx]
        if isinstance(columns, slice):
            return visibility_mask(evict[..., columns], self.positions[:, columns], self.valid[:, columns], queries)
        per_head = columns.expand(-1, evict.shape[1], -1)
        return visibility_mask(
            evict.gather(-1, per_head),
            self.positions[:, None].expand_as(evict).gather(-1, per_head),
            self.valid[:, None].expand_as(evict).gather(-1, per_head),
            queries,
        )

    def layer_columns(self, layer_idx: int, num_queries: int, start: int, end: int) -> slice | torch.Tensor:
        """The key columns the last ``num_queries`` columns' rows start:end may see in one layer (``seen_columns``
        of a superset: the keys written by the last of the real queries and alive at the first; where a row has
        padding queries, which sit at position 0, also its first real token), from the record alone."""
        queries = self.positions[:, -num_queries:][:, start:end]  # [B, Q]
        real = self.valid[:, -num_queries:][:, start:end]
        first = torch.where(real, queries, torch.iinfo(queries.dtype).max).min(-1).values  # [B]
        last = queries.max(-1).values
        evict = self.evict_cols[:, layer_idx]  # [B, Hkv, T]
        keys = self.valid & (self.positions <= last[:, None])  # [B, T]
        may_see = (evict > first[:, None, None]) & keys[:, None]
        padding = (~real).any(-1)[:, None] & self.valid & (self.positions == 0)  # what a padding query sees
        return seen_columns(may_see | (padding[:, None] & (evict > 0)))

    def layer_mask_mod(self, layer_idx: int, num_heads: int, num_queries: int):
        """FlexAttention's mask function of one layer (query heads ``num_heads``) for the last ``num_queries``
        columns: what a partial tile evaluates."""
        evict = self.evict_cols[:, layer_idx]
        pos, valid = self.positions, self.valid
        groups = num_heads // evict.shape[1]
        offset = pos.shape[-1] - num_queries

        def mask_mod(b, h, q_idx, kv_idx):
            q_pos = pos[b, q_idx + offset]
            return valid[b, kv_idx] & (pos[b, kv_idx] <= q_pos) & (evict[b, h // groups, kv_idx] > q_pos)

        return mask_mod

    def layer_block_mask(self, layer_idx: int, num_heads: int, num_queries: int):
        """FlexAttention BlockMask of one layer (query heads ``num_heads``) for the last ``num_queries`` columns,
        its full and partial tiles from the record's block summaries (``block_classes``: the mask function is
        evaluated on the undecided tiles only, not on every query-key pair as ``create_block_mask`` does)."""
        from torch.nn.attention.flex_attention import BlockMask

        evict = self.evict_cols[:, layer_idx]
        full, partial = block_classes(evict, self.positions, self.valid, num_queries)
        groups = num_heads // evict.shape[1]
        kv_num, kv_index = block_lists(partial, groups)
        full_num, full_index = block_lists(full, groups)
        return BlockMask.from_kv_blocks(
            kv_num,
            kv_index,
            full_num,
            full_index,
            BLOCK_SIZE=BLOCK,
            mask_mod=self.layer_mask_mod(layer_idx, num_heads, num_queries),
            seq_lengths=(num_queries, self.positions.shape[-1]),
        )

    def attend(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0):
        num_queries = query.shape[2]
        if resolved_backend(self.backend, query.is_cuda) == "flex":
            from transformers.integrations.flex_attention import flex_attention_forward

            block_mask = self.layer_block_mask(module.layer_idx, query.shape[1], num_queries)
            return flex_attention_forward(module, query, key, value, block_mask, scaling=scaling, dropout=dropout)
        layer = module.layer_idx
        return masked_attention(
            query,
            key,
            value,
            lambda start, end, columns: self.layer_mask(layer, num_queries, start, end, columns),
            scaling,
            dropout if module.training else 0.0,
            columns_of=lambda start, end: self.layer_columns(layer, num_queries, start, end),
        )


@dataclass
class EvictionRecord:
    """The eviction records of a batch (``gkv_rollout.contract.record.Record``).

    evict_at int32 [B, L, Hkv, T]: the logical position of the first query that no longer sees each key
    (``NEVER``: none), in the canonical form of ``after_end_is_never``.
    """

    evict_at: torch.Tensor

    BATCH_KEY = "evict_at"

    def __getitem__(self, rows) -> "EvictionRecord":
        return EvictionRecord(self.evict_at[batch_rows(rows)])

    def to_batch(self) -> dict[str, torch.Tensor]:
        return {self.BATCH_KEY: self.evict_at}

    @classmethod
    def from_batch(cls, batch) -> "EvictionRecord | None":
        return cls(batch[cls.BATCH_KEY]) if cls.BATCH_KEY in batch else None

    def roll_layers(self, shift: int) -> "EvictionRecord":
        return EvictionRecord(self.evict_at.roll(shift, dims=1))

    def nbytes(self, row: int = 0) -> int:
        return self.evict_at[row].numel() * self.evict_at.element_size()

    def attention_context(self, model, attention_mask: torch.Tensor, backend: str = "auto") -> EvictionMasks | None:
        """The rows' ``EvictionMasks``; None when the record evicts nothing any of them would see
        (``EvictionMasks.evicts_nothing``): the forward then attends as a full cache's does, through the model's
        own SDPA call (``is_causal`` without padding, else transformers' padding mask), as TRL's forward does."""
        masks = EvictionMasks.build(self.evict_at, attention_mask, backend)
        return None if masks.evicts_nothing() else masks

    def kept_at(self, row: int, position: int) -> torch.Tensor:
        """bool [L * Hkv, position + 1]: the keys each (layer, KV head) held for the query at ``position``."""
        return (self.evict_at[row, :, :, : position + 1] > position).reshape(-1, position + 1)

    def retention(self, lengths: torch.Tensor) -> torch.Tensor:
        """float32 [B]: cache length / sequence length at each sequence's last token (``retention``)."""
        return retention(self.evict_at, lengths)
