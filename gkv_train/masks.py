"""Per-layer, per-KV-head attention masks built on the fly from an eviction record.

``RecordMasks`` is the attention context (see ``gkv_train.attention``) of a training forward under a G-KV-family
record: every layer builds its own mask from its slice of the record when it runs, so no [B, L, T, T] tensor is
ever held. On CPU the mask is a dense boolean tensor for SDPA; with ``backend="flex"`` (default on CUDA) it is a
FlexAttention ``BlockMask`` whose mask function reads the record directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gkv_train.attention import sdpa_with_head_mask
from gkv_train.record import logical_positions, record_to_columns, visibility_mask

BACKENDS = ("auto", "sdpa", "flex")


@dataclass
class RecordMasks:
    """Attention context of a forward over a padded batch under an eviction record.

    evict_cols: int32 [B, L, Hkv, T] eviction stamp of the key in each column, per layer and KV head;
    positions: int64 [B, T] logical position of each column; valid: bool [B, T] real (non-padding) columns.
    """

    evict_cols: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor
    backend: str = "auto"

    @classmethod
    def build(cls, evict_at: torch.Tensor, attention_mask: torch.Tensor, backend: str = "auto") -> "RecordMasks":
        """evict_at: int32 [B, L, Hkv, T_rec] record; attention_mask: [B, T] padding mask of the batch."""
        if backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}; choose one of {BACKENDS}")
        if evict_at.shape[0] != attention_mask.shape[0]:
            raise ValueError(f"record has {evict_at.shape[0]} rows but the batch has {attention_mask.shape[0]}")
        positions = logical_positions(attention_mask)
        evict_cols = record_to_columns(evict_at.to(attention_mask.device), positions)
        return cls(evict_cols, positions, attention_mask.bool(), backend)

    def layer_mask(self, layer_idx: int, num_queries: int) -> torch.Tensor:
        """Dense bool mask [B, Hkv, Q, T] of one layer for the last ``num_queries`` columns."""
        return visibility_mask(
            self.evict_cols[:, layer_idx], self.positions, self.valid, self.positions[:, -num_queries:]
        )

    def layer_block_mask(self, layer_idx: int, num_heads: int, num_queries: int):
        """FlexAttention BlockMask of one layer (query heads ``num_heads``) for the last ``num_queries`` columns."""
        from torch.nn.attention.flex_attention import create_block_mask

        evict = self.evict_cols[:, layer_idx]
        pos, valid = self.positions, self.valid
        groups = num_heads // evict.shape[1]
        offset = pos.shape[-1] - num_queries

        def mask_mod(b, h, q_idx, kv_idx):
            q_pos = pos[b, q_idx + offset]
            return valid[b, kv_idx] & (pos[b, kv_idx] <= q_pos) & (evict[b, h // groups, kv_idx] > q_pos)

        B, T = pos.shape
        return create_block_mask(mask_mod, B, num_heads, num_queries, T, device=pos.device)

    def attend(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0):
        num_queries = query.shape[2]
        backend = self.backend
        if backend == "auto":
            backend = "flex" if query.is_cuda else "sdpa"
        if backend == "flex":
            from transformers.integrations.flex_attention import flex_attention_forward

            block_mask = self.layer_block_mask(module.layer_idx, query.shape[1], num_queries)
            return flex_attention_forward(module, query, key, value, block_mask, scaling=scaling, dropout=dropout)
        mask = self.layer_mask(module.layer_idx, num_queries)
        return sdpa_with_head_mask(query, key, value, mask, scaling, dropout if module.training else 0.0)


def attention_context(model, record, attention_mask: torch.Tensor, backend: str = "auto"):
    """The attention context reproducing a rollout's record over a padded batch (attention_mask [B, T]):
    ``RecordMasks`` for a G-KV-family ``evict_at`` tensor, ``S4RMasks`` for an ``S4RRecord``, None for None."""
    from gkv_train.s4r import S4RMasks, S4RRecord

    if record is None:
        return None
    if isinstance(record, S4RRecord):
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        return S4RMasks.build(record, attention_mask, base.get_decoder().rotary_emb)
    return RecordMasks.build(record, attention_mask, backend)
