"""S4R in the rollout: a prompt-aware low-rank cache with sparse reconstruction (per layer).

Prefill: the prompt attends exactly (causal, as without compression). Then the first ``s`` tokens stay exact
(sinks); from the other prompt tokens a share ``eta`` is sampled (recent block : uniform = 7 : 3), their
pre-RoPE keys and values (all KV heads side by side, D' wide) normalised and decomposed by truncated SVD into
bases B_K, B_V; every non-sink token, and later every generated one, is stored as coefficients C = S B of its
unnormalised states; the last W queries are kept projected into B_K, per GQA group member.

Decode step: latent logits C_Q C_K^T / sqrt(r) (causal) are softmaxed over the cache and averaged over the W
queries, pooled along the sequence and averaged over the GQA group; the last W tokens and the top
max(floor(rho L_t) - W, 0) others are reconstructed (C B^T), RoPE applied at their original positions, and
the new token attends exactly to them and the sinks. The selection is recorded per layer and generated
token; ``gkv_train.rollout.contract.s4r_record.S4RMasks`` replays it in training.

Pre-RoPE keys and queries come from rotating back what the attention function receives (exact up to float
error); sink keys are kept as received (after RoPE), which is their pre-RoPE value rotated once.
"""

from __future__ import annotations

import time

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from gkv_train.rollout.config import CompressionConfig
from gkv_train.rollout.contract.attention import head_dim
from gkv_train.rollout.contract.bits import pack_bits, unpack_bits
from gkv_train.rollout.contract.rope import apply_rope, concat_to_heads, group_queries, heads_to_concat, inverse_rope
from gkv_train.rollout.contract.s4r_record import S4RRecord
from gkv_train.rollout.kv_cache import KVCache
from gkv_train.rollout.lowrank import (
    latent_scores,
    low_rank_bases,
    persistent_elements,
    s4r_rank,
    sample_positions,
    select_tokens,
)
from gkv_train.rollout.scoring import aggregate_group, pool_scores


class S4RCache(KVCache):
    """S4R attention context of one batched rollout. Slot i of the coefficient buffers holds logical position
    ``i + sinks`` (nothing is evicted: every token is kept, low-rank)."""

    def __init__(self, model, compression: CompressionConfig, batch_size: int, prompt_width: int, max_new: int, device):
        cfg = model.config
        self.compression = compression = compression.resolved()
        self.rotary = model.get_decoder().rotary_emb
        self.L = cfg.num_hidden_layers
        self.H, self.Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.D = head_dim(cfg)
        self.dim = self.Hkv * self.D
        self.G = self.H // self.Hkv
        self.s, self.W = compression.sinks, compression.window
        self.B, self.max_new = batch_size, max_new
        self.length = prompt_width + max_new  # logical positions the buffers cover
        self.device = device
        self.valid = torch.zeros(batch_size, self.length, dtype=torch.bool, device=device)  # by logical position
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.compressions = 0  # S4R scores every step instead of compressing in rounds
        self.seconds = 0.0  # time spent building bases, scoring, selecting and reconstructing
        self.step = -1  # generated tokens whose query has attended (-1: prefill)
        self._positions = None
        self._buffers_ready = False
        self.rows = None  # the batch rows held, when finished ones have left (None: all, in order)
        self._all_bases = None  # (bases_k, bases_v) of every row, for the record, once rows have left

    # ---- engine interface ----------------------------------------------------------------------------
    def begin(self, positions: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Register the next forward's tokens (logical positions [B, Q], real [B, Q]); returns the prefill's
        causal + padding mask (decode steps build their own)."""
        self._positions, self._valid_new = positions, valid
        self.lengths += valid.sum(-1)
        self.valid = torch.arange(self.length, device=self.device)[None, :] < self.lengths[:, None]
        Q = positions.shape[1]
        cols = torch.arange(Q, device=positions.device)
        causal = cols[None, :] <= cols[:, None]
        mask = (valid[:, None, :] & causal[None]) | torch.eye(Q, dtype=torch.bool, device=positions.device)[None]
        return mask[:, None]

    def attend(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0):
        if query.shape[2] > 1 or self.step < 0:
            return self._prefill(module, query, key, value, attention_mask, scaling)
        return self._decode(module, query, key, value, scaling)

    def end(self) -> None:
        self.step += 1

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep the sequences at indices keep int64 [B'] of the rows held now; the record keeps every row."""
        if self.rows is None:
            self.rows = torch.arange(self.B, device=keep.device)
            self._all_bases = (self.bases_k, self.bases_v)  # fixed after prefill
        self.rows, self.B = self.rows[keep], len(keep)
        for name in ("sink_k", "sink_v", "bases_k", "bases_v", "coef_k", "coef_v", "cq"):  # one at a time
            setattr(self, name, getattr(self, name).index_select(1, keep))
        for name in ("valid", "lengths", "q_pos", "q_ok", "rank_k", "rank_v"):
            setattr(self, name, getattr(self, name)[keep])

    def nbytes(self) -> int:
        """Bytes of the persistent state (per ``persistent_elements``, summed over sequences and layers)."""
        return self._persistent_elements() * 4

    # ---- prefill -------------------------------------------------------------------------------------
    def _prefill(self, module, query, key, value, attention_mask, scaling):
        out = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling)
        start = time.perf_counter()
        self._build(module.layer_idx, query, key, value)
        self.seconds += time.perf_counter() - start
        return out

    def _allocate(self, dtype) -> None:
        cfg, B, L = self.compression, self.B, self.L
        prompt = self.lengths  # real prompt tokens per sequence
        if bool((prompt <= self.s).any()):
            raise ValueError(f"s4r needs prompts longer than its {self.s} sinks")
        ranks = [s4r_rank(cfg.eta, self.s, int(n) - self.s, self.dim, self.G, self.W) for n in prompt]
        self.rank_k = torch.tensor([cfg.rank or r for r in ranks], device=self.device).clamp_max(self.dim)
        self.rank_v = torch.tensor([cfg.rank_v or cfg.rank or r for r in ranks], device=self.device).clamp_max(self.dim)
        rk, rv, S = int(self.rank_k.max()), int(self.rank_v.max()), self.length - self.s
        f32 = dict(dtype=torch.float32, device=self.device)
        self.sink_k = torch.zeros(L, B, self.Hkv, self.s, self.D, dtype=dtype, device=self.device)
        self.sink_v = torch.zeros_like(self.sink_k)
        self.bases_k, self.bases_v = torch.zeros(L, B, self.dim, rk, **f32), torch.zeros(L, B, self.dim, rv, **f32)
        self.coef_k, self.coef_v = torch.zeros(L, B, S, rk, **f32), torch.zeros(L, B, S, rv, **f32)
        self.cq = torch.zeros(L, B, self.G, self.W, rk, **f32)
        self.q_pos = torch.zeros(B, self.W, dtype=torch.long, device=self.device)
        self.q_ok = torch.zeros(B, self.W, dtype=torch.bool, device=self.device)
        # Bit-packed selection of every layer and generated token, over logical positions.
        self.selected = torch.zeros(L, B, self.max_new, (self.length + 7) // 8, dtype=torch.uint8, device=self.device)
        self._buffers_ready = True

    def _build(self, layer, query, key, value) -> None:
        """Sinks, bases, coefficients of every prompt token and the projected query window of one layer."""
        if not self._buffers_ready:
            self._allocate(key.dtype)
        cfg, pos, valid = self.compression, self._positions, self._valid_new
        cos, sin = self.rotary(value, pos)
        k_pre = heads_to_concat(inverse_rope(key, cos, sin)).float()  # [B, P, D']
        v_cat = heads_to_concat(value).float()
        q_pre = group_queries(inverse_rope(query, cos, sin), self.Hkv).float()  # [B, G, P, D']
        rk, rv = self.bases_k.shape[-1], self.bases_v.shape[-1]
        for b in range(self.B):
            cols = valid[b].nonzero().squeeze(-1)  # real prompt columns, in position order
            sink_cols, rest = cols[: self.s], cols[self.s :]
            self.sink_k[layer, b] = key[b][:, sink_cols]
            self.sink_v[layer, b] = value[b][:, sink_cols]
            count = max(round(cfg.eta * len(rest)), int(self.rank_k[b]))
            sampled = rest[sample_positions(len(rest), count, cfg.recent_ratio)]
            self.bases_k[layer, b] = torch.nn.functional.pad(
                low_rank_bases(k_pre[b, sampled][None], int(self.rank_k[b]), cfg.normalize)[0], (0, rk - int(self.rank_k[b]))
            )
            self.bases_v[layer, b] = torch.nn.functional.pad(
                low_rank_bases(v_cat[b, sampled][None], int(self.rank_v[b]), cfg.normalize)[0], (0, rv - int(self.rank_v[b]))
            )
        slots = (pos - self.s).clamp_min(0)  # [B, P]
        keep = (valid & (pos >= self.s))[..., None]
        ck = (k_pre @ self.bases_k[layer]) * keep
        cv = (v_cat @ self.bases_v[layer]) * keep
        self.coef_k[layer].scatter_add_(1, slots[..., None].expand_as(ck), ck)
        self.coef_v[layer].scatter_add_(1, slots[..., None].expand_as(cv), cv)
        self._push_queries(layer, q_pre[:, :, -self.W :], pos[:, -self.W :], valid[:, -self.W :])

    def _push_queries(self, layer, q_pre, pos, ok) -> None:
        """Append the newest projected queries q_pre [B, G, n, D'] to the FIFO of the last W."""
        n = q_pre.shape[2]
        cq = q_pre @ self.bases_k[layer][:, None]  # [B, G, n, r]
        self.cq[layer] = torch.cat([self.cq[layer][:, :, n:], cq], dim=2)[:, :, -self.W :]
        if layer == 0:
            self.q_pos = torch.cat([self.q_pos[:, n:], pos], dim=1)[:, -self.W :]
            self.q_ok = torch.cat([self.q_ok[:, n:], ok], dim=1)[:, -self.W :]

    # ---- decode --------------------------------------------------------------------------------------
    def _decode(self, module, query, key, value, scaling):
        start = time.perf_counter()
        layer, cfg = module.layer_idx, self.compression
        pos = self._positions  # [B, 1]
        cos, sin = self.rotary(value, pos)
        k_pre = heads_to_concat(inverse_rope(key, cos, sin)).float()  # [B, 1, D']
        slot = pos - self.s  # prompts are longer than the sinks: every generated token is stored low-rank
        self.coef_k[layer].scatter_(1, slot[..., None].expand(-1, -1, self.coef_k.shape[-1]), k_pre @ self.bases_k[layer])
        cv = heads_to_concat(value).float() @ self.bases_v[layer]
        self.coef_v[layer].scatter_(1, slot[..., None].expand(-1, -1, self.coef_v.shape[-1]), cv)
        self._push_queries(layer, group_queries(inverse_rope(query, cos, sin), self.Hkv).float(), pos, self._valid_new)

        # Score the non-sink cache in the latent space and pick what to reconstruct.
        S = int(pos.max()) + 1 - self.s
        k_pos = torch.arange(self.s, self.s + S, device=pos.device).expand(self.B, -1)
        k_ok = self.valid[:, self.s : self.s + S] & (k_pos <= pos)
        score = latent_scores(self.cq[layer], self.q_pos, self.q_ok, self.coef_k[layer][:, :S], k_pos, k_ok, self.rank_k)
        score = pool_scores(score, k_ok[:, None, :], cfg.pool_kernel, cfg.pool)  # [B, G, S]
        score = aggregate_group(score, 1, cfg.group_agg)
        chosen = select_tokens(score, k_pos, k_ok, pos[:, 0], k_ok.sum(-1), self.W, cfg.rho, layer in cfg.full_layers)
        self.selected[layer, slice(None) if self.rows is None else self.rows, self.step] = pack_bits(torch.nn.functional.pad(chosen, (self.s, self.length - self.s - S)))

        # Reconstruct the chosen tokens, RoPE at their positions, and attend with the sinks.
        n = int(chosen.sum(-1).max())
        order = (~chosen).to(torch.int8).argsort(dim=-1, stable=True)[:, :n]  # chosen slots first, in position order
        picked = chosen.gather(-1, order)
        ck = self.coef_k[layer].gather(1, order[..., None].expand(-1, -1, self.coef_k.shape[-1]))
        cv = self.coef_v[layer].gather(1, order[..., None].expand(-1, -1, self.coef_v.shape[-1]))
        rec_pos = order + self.s
        rc, rs = self.rotary(value, rec_pos)
        keys = apply_rope(concat_to_heads(ck @ self.bases_k[layer].transpose(-1, -2), self.Hkv).to(key.dtype), rc, rs)
        values = concat_to_heads(cv @ self.bases_v[layer].transpose(-1, -2), self.Hkv).to(value.dtype)
        keys = torch.cat([self.sink_k[layer], keys], dim=2)
        values = torch.cat([self.sink_v[layer], values], dim=2)
        mask = torch.cat([torch.ones_like(picked[:, :1]).expand(-1, self.s), picked], dim=1)[:, None, None, :]
        self.seconds += time.perf_counter() - start
        return sdpa_attention_forward(module, query, keys, values, mask, scaling=scaling)

    # ---- results -------------------------------------------------------------------------------------
    def finish(self, prompt_lengths, completion_lengths, width: int):
        """(record, retention): the ``S4RRecord`` (selections of the generated tokens, positions < width) and the
        tokens the last decoding query attended to (sinks + reconstructed) / sequence length, mean over layers."""
        steps, N = int(completion_lengths.max()), completion_lengths.shape[0]
        bases_k, bases_v = (self.bases_k, self.bases_v) if self._all_bases is None else self._all_bases
        selected = self.selected[:, :, :steps, : (width + 7) // 8].transpose(0, 1).clone()
        # canonical: no selection for steps past a sequence's end (decoded only while its batch went on)
        past_end = torch.arange(steps, device=self.device)[None, :] >= (completion_lengths - 1)[:, None]
        selected[past_end[:, None, :, None].expand_as(selected)] = 0
        record = S4RRecord(
            bases_k=bases_k.transpose(0, 1).contiguous(),
            bases_v=bases_v.transpose(0, 1).contiguous(),
            selected=selected,
            prompt_lengths=prompt_lengths.clone(),
            sinks=torch.full((N,), self.s, dtype=torch.long, device=self.device),
        )
        last = (completion_lengths - 2).clamp_min(0)  # the last generated token whose query attended
        rows = selected.transpose(0, 1)[:, torch.arange(N), last]  # [L, B, bytes]
        counts = unpack_bits(rows, rows.shape[-1] * 8).sum(-1).float().mean(0)
        total = prompt_lengths + completion_lengths
        retention = ((counts + self.s) / total.float()).clamp_max(1.0)
        # a one-token completion: only the prefill's queries attended, to every prompt token
        return record, torch.where(completion_lengths < 2, 1.0, retention)

    def _persistent_elements(self) -> int:
        return sum(
            persistent_elements(self.s, int(n) - self.s, self.dim, self.G, self.W, int(rk), int(rv))
            for n, rk, rv in zip(self.lengths, self.rank_k, self.rank_v)
        ) * self.L
