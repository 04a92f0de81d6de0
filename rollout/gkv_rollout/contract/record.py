"""What a record is: the declared protocol every rollout record follows, and the logical positions it speaks in.

A record says what every generated token of a rollout could see, per layer (and KV head). The rollout writes
one; a trainer reads it back, row for row, through the attention context it builds (``attention_context``),
and reproduces the rollout's log-probs exactly. Two formats implement the protocol:
``gkv_rollout.contract.eviction.EvictionRecord`` (the G-KV family) and ``gkv_rollout.contract.s4r_record.S4RRecord``.

Logical positions count the real tokens of a sequence from 0 (left padding excluded), so a record does not
depend on how a batch is padded, and RoPE positions never shift when tokens are evicted.
"""

from __future__ import annotations

import numbers
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class Record(Protocol):
    """A batch of rollout records (every tensor has a leading batch dimension)."""

    def __getitem__(self, rows) -> "Record":
        """The records of some rows (an index, slice or index tensor over the batch)."""

    def to_batch(self) -> dict[str, torch.Tensor]:
        """Batch entries carrying the record (tensors with a leading batch dimension, so that a trainer's
        shuffling and splitting move them with the rows); ``from_batch`` reads them back."""

    @classmethod
    def from_batch(cls, batch) -> "Record | None":
        """The record held by a (shuffled, split) batch, or None when the batch holds none of this format."""

    def roll_layers(self, shift: int) -> "Record":
        """Every layer's part moved ``shift`` layers: a control that must not reproduce the rollout."""

    def nbytes(self, row: int = 0) -> int:
        """Bytes of one sequence's record."""

    def attention_context(self, model, attention_mask: torch.Tensor, backend: str = "auto"):
        """The attention context (``gkv_rollout.contract.attention``) under which a forward of ``model`` over the
        padded batch (attention_mask [B, T]) attends exactly as the rollout did; None when plain causal attention
        does (the rows' records evict nothing they would see), so the forward takes the model's own SDPA path."""

    def kept_at(self, row: int, position: int) -> torch.Tensor:
        """bool [parts, position + 1]: the keys (logical positions 0..position) the query at logical
        ``position`` of sequence ``row`` attended to, one row per layer (and KV head, for eviction)."""


def batch_rows(rows):
    """Row selector that keeps the batch dimension: an integer (Python, numpy or 0-d tensor) becomes a list."""
    if isinstance(rows, numbers.Integral) or (isinstance(rows, torch.Tensor) and rows.dim() == 0):
        return [int(rows)]
    return rows


def logical_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Logical position of every column of a padded batch.

    attention_mask: [B, T] (1 for real tokens, 0 for padding, any padding side).
    Returns int64 [B, T]: the number of real tokens before each column; padding columns get 0.
    """
    mask = attention_mask.long()
    return ((mask.cumsum(-1) - 1) * mask).clamp_min(0)


def causal_mask(key_positions: torch.Tensor, key_valid: torch.Tensor, query_positions: torch.Tensor) -> torch.Tensor:
    """Causal + padding mask in logical positions.

    key_positions: int64 [B, K]; key_valid: bool [B, K] (False for padding); query_positions: int64 [B, Q].
    Returns bool [B, 1, Q, K]. A padding query has logical position 0 and so sees the first real token: no
    row is empty, so SDPA never produces NaN for it (its output is ignored).
    """
    mask = key_valid[:, None, :] & (key_positions[:, None, :] <= query_positions[:, :, None])
    return mask[:, None]
