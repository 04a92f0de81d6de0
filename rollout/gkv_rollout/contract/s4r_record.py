"""The S4R record and the training forward that reproduces an S4R rollout.

Record (per sequence and layer): the key and value bases (D' x r, zero columns pad a smaller rank), the sink
count, and for every generated token the set of non-sink positions its query reconstructed, bit-packed.
Size for SmolLM2 (30 layers, D' = 192) with 1024 generated tokens after a ~150-token prompt: selections
30 x 1024 x 147 bytes = 4.5 MB and bases 30 x 192 x 2r x 4 bytes (r = 38 at eta = 0.2: 1.75 MB) per sequence.
A list of int16 indices would cost 2 bytes per selected token: more than the 1/8 byte per position of the
bitmask as soon as more than 1/16 of the positions are selected (rho = 0.2 selects 1/5).

Training forward (``S4RMasks``): prompt queries attend with exact keys and values, as in prefill; the query of
generated token j attends to the exact sinks plus its selected tokens, whose pre-RoPE keys and values are
replaced by their projections S B B^T, RoPE then applied at their original positions. Keys arrive in the
attention function after RoPE; rotating back by the same angles recovers the pre-RoPE keys (RoPE is a
rotation), with no hook into architecture-specific projection or normalisation modules. One SDPA call over
2T keys (the T exact ones, then the T projected ones) with a per-layer mask does both kinds of query.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from gkv_rollout.contract.attention import base_model, masked_attention
from gkv_rollout.contract.bits import unpack_bits
from gkv_rollout.contract.record import batch_rows, logical_positions
from gkv_rollout.contract.rope import apply_rope, concat_to_heads, heads_to_concat, inverse_rope

BATCH_PREFIX = "s4r_"


@dataclass
class S4RRecord:
    """What an S4R rollout attended to. Every tensor has a leading batch dimension.

    bases_k float32 [B, L, D', r_k], bases_v float32 [B, L, D', r_v];
    selected uint8 [B, L, C, ceil(T / 8)]: bit k of row j set when generated token j's query reconstructed the
    key at logical position k; prompt_lengths int64 [B]; sinks int64 [B] (the same value in every row);
    key_rank, value_rank int16 [B, T]: how many leading columns of the bases the token at each logical position
    was stored with (all of a row's rank without ``refresh``; with it, the columns that existed when the token
    was written: later refreshes append columns, so earlier ones never change).
    """

    bases_k: torch.Tensor
    bases_v: torch.Tensor
    selected: torch.Tensor
    prompt_lengths: torch.Tensor
    sinks: torch.Tensor
    key_rank: torch.Tensor
    value_rank: torch.Tensor

    def __getitem__(self, rows) -> "S4RRecord":
        rows = batch_rows(rows)
        return S4RRecord(*(getattr(self, f.name)[rows] for f in fields(self)))

    def roll_layers(self, shift: int) -> "S4RRecord":
        """The record with every layer's bases and selections moved ``shift`` layers (a control)."""
        return S4RRecord(
            self.bases_k.roll(shift, 1),
            self.bases_v.roll(shift, 1),
            self.selected.roll(shift, 1),
            self.prompt_lengths,
            self.sinks,
            self.key_rank,
            self.value_rank,
        )

    def to_batch(self) -> dict[str, torch.Tensor]:
        return {BATCH_PREFIX + f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_batch(cls, batch) -> "S4RRecord | None":
        if BATCH_PREFIX + "bases_k" not in batch:
            return None
        return cls(*(batch[BATCH_PREFIX + f.name] for f in fields(cls)))

    def nbytes(self, row: int = 0) -> int:
        """Bytes of one sequence's record."""
        return sum(getattr(self, f.name)[row].numel() * getattr(self, f.name).element_size() for f in fields(self))

    def attention_context(self, model, attention_mask: torch.Tensor, backend: str = "auto") -> "S4RMasks":
        """``S4RMasks`` (SDPA on every device: ``backend`` applies to eviction records only)."""
        return S4RMasks.build(self, attention_mask, base_model(model).get_decoder().rotary_emb)

    def kept_at(self, row: int, position: int) -> torch.Tensor:
        """bool [L, position + 1]: the exact sinks and the tokens the query at ``position`` reconstructed (every
        earlier token for a prompt query, which attends exactly)."""
        step = position - int(self.prompt_lengths[row])
        L = self.selected.shape[1]
        if step < 0:
            return torch.ones(L, position + 1, dtype=torch.bool, device=self.selected.device)
        kept = unpack_bits(self.selected[row, :, step], position + 1)
        kept[:, : int(self.sinks[row])] = True
        return kept


@dataclass
class S4RMasks:
    """Attention context of a training forward under an ``S4RRecord``.

    positions, valid: logical positions and real columns [B, T] of the padded batch; rotary: the model's rotary
    embedding module (for cos/sin at those positions).
    """

    record: S4RRecord
    positions: torch.Tensor
    valid: torch.Tensor
    rotary: torch.nn.Module

    @classmethod
    def build(cls, record: S4RRecord, attention_mask: torch.Tensor, rotary: torch.nn.Module) -> "S4RMasks":
        return cls(record, logical_positions(attention_mask), attention_mask.bool(), rotary)

    def layer_mask(self, layer: int, start: int = 0, end: int | None = None) -> torch.Tensor:
        """bool [B, 1, Q, 2T] for the query rows start:end (Q of them; all T by default): the exact keys (first T
        columns) and projected keys (last T) each query may see."""
        rec, pos, valid = self.record, self.positions, self.valid
        q_pos = pos[:, start:end]  # [B, Q]
        causal = valid[:, None, :] & (pos[:, None, :] <= q_pos[:, :, None])  # [B, Q, Tk]
        generated = q_pos >= rec.prompt_lengths[:, None]  # [B, Q] queries after the prompt
        sink = pos < rec.sinks[:, None]  # [B, Tk]
        exact = causal & (~generated[:, :, None] | sink[:, None, :])
        # Selection row of each generated query, as bits over logical key positions.
        rows = (q_pos - rec.prompt_lengths[:, None]).clamp(0, rec.selected.shape[2] - 1)
        packed = rec.selected[:, layer]  # uint8 [B, C, T_rec / 8]: the chunk's rows are gathered before unpacking
        packed = packed.gather(1, rows[:, :, None].expand(-1, -1, packed.shape[-1]))  # [B, Q, T_rec / 8]
        chosen = unpack_bits(packed, packed.shape[-1] * 8)  # [B, Q, T_rec]
        chosen = chosen.gather(2, pos[:, None, :].expand(-1, q_pos.shape[1], -1))  # [B, Q, Tk]
        projected = causal & generated[:, :, None] & ~sink[:, None, :] & chosen
        return torch.cat([exact, projected], dim=-1)[:, None]

    def stored_columns(self, coefficients: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
        """coefficients [B, T, r] with the columns a token was not stored with (``key_rank`` / ``value_rank`` at
        its logical position) set to 0."""
        at = rank.long().gather(1, self.positions.clamp_max(rank.shape[1] - 1))  # [B, T]
        columns = torch.arange(coefficients.shape[-1], device=coefficients.device)
        return coefficients * (columns < at[..., None]).to(coefficients.dtype)

    def attend(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0):
        layer, heads = module.layer_idx, key.shape[1]
        cos, sin = self.rotary(value, self.positions)
        pre = heads_to_concat(inverse_rope(key, cos, sin))  # [B, T, D']
        bk, bv = self.record.bases_k[:, layer].to(pre.dtype), self.record.bases_v[:, layer].to(pre.dtype)
        ck, cv = (
            self.stored_columns(pre @ bk, self.record.key_rank),
            self.stored_columns(heads_to_concat(value) @ bv, self.record.value_rank),
        )
        key_hat = apply_rope(concat_to_heads(ck @ bk.transpose(-1, -2), heads), cos, sin)
        value_hat = concat_to_heads(cv @ bv.transpose(-1, -2), heads)
        keys, values = torch.cat([key, key_hat], dim=2), torch.cat([value, value_hat], dim=2)
        return masked_attention(
            query,
            keys,
            values,
            lambda start, end: self.layer_mask(layer, start, end),
            scaling,
            dropout if module.training else 0.0,
        )
