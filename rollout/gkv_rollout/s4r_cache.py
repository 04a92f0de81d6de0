"""S4R in the rollout: a prompt-aware low-rank cache with sparse reconstruction (per layer).

Prefill: the prompt attends exactly (causal, as without compression). Then the first ``s`` tokens stay exact
(sinks); from the other prompt tokens a share ``eta`` is sampled (recent block : uniform = 7 : 3), their
pre-RoPE keys and values (all KV heads side by side, D' wide) normalised and decomposed by truncated SVD into
bases B_K, B_V; every non-sink token, and later every generated one, is stored as coefficients C = S B of its
unnormalised states; the last W queries are kept projected into B_K, per GQA group member.

Decode step: latent logits C_Q C_K^T / sqrt(r) (causal) are softmaxed over the cache and averaged over the W
queries, pooled along the sequence and averaged over the GQA group (a query's softmax over the keys before it
never changes, so the window's sum is kept per layer and moves by the query that enters and the one that leaves:
two query rows per step instead of W); the last W tokens and the top
max(floor(rho L_t) - W, 0) others are reconstructed (C B^T), RoPE applied at their original positions, and
the new token attends exactly to them and the sinks. The selection is recorded per layer and generated
token; ``gkv_rollout.contract.s4r_record.S4RMasks`` replays it in training.

Pre-RoPE keys and queries come from rotating back what the attention function receives (exact up to float
error); sink keys are kept as received (after RoPE), which is their pre-RoPE value rotated once.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from gkv_rollout.contract.attention import head_dim
from gkv_rollout.contract.bits import pack_bits, unpack_bits
from gkv_rollout.contract.rope import group_queries, heads_to_concat, inverse_rope
from gkv_rollout.contract.s4r_record import S4RRecord
from gkv_rollout.kv_cache import KVCache
from gkv_rollout.lowrank import (
    SelectionBudget,
    chosen_in_order,
    extend_bases,
    hidden_keys,
    key_bias,
    latent_probs,
    low_rank_bases,
    persistent_elements,
    s4r_rank,
    sample_positions,
    select_tokens,
    selection_budget,
    split_rank,
)
from gkv_rollout.methods import Method
from gkv_rollout.scoring import aggregate_group, pool_scores

# where S4R's time goes (``S4RCache.phase_seconds``): fitting the bases in the prefill; then, per decode step,
# writing the new token's coefficients, scoring in the latent space and selecting; reconstructing the chosen keys
# (RoPE included); the new token's attention; packing the selections into the record; refreshing the bases
PHASES = ("fit", "score", "reconstruct", "attend", "record", "refresh")


class DecodeStep(NamedTuple):
    """What every layer of one decode step shares (computed at its first layer)."""

    step: int
    cos: torch.Tensor  # [B, 1, D] RoPE of the new token
    sin: torch.Tensor
    slot: torch.Tensor  # int64 [B, 1, 1]: its coefficient slot
    ring: int  # its place in the query window, where the oldest query leaves
    S: int  # slots scored: up to the newest position
    k_ok: torch.Tensor  # bool [B, S] occupied slots up to each sequence's position
    pair_bias: torch.Tensor  # float32 [B, G * 2, S]: -inf on keys hidden from the query entering / leaving the window
    pair_weight: torch.Tensor  # float64 [B, 2, 1, 1]: +1 entering, -1 leaving, 0 for an invalid query
    budget: SelectionBudget
    mask: torch.Tensor | None  # bool [B, s + n]: sinks and reconstructed slots each row attends (None: all)
    full: tuple | None  # (n, mask) for ``full_layers``, which reconstruct every occupied slot
    row_offsets: torch.Tensor  # int64 [B, 1]: each row's first slot in a layer's flattened coefficients


class S4RCache(KVCache):
    """S4R attention context of one batched rollout. Slot i of the coefficient buffers holds logical position
    ``i + sinks`` (nothing is evicted: every token is kept, low-rank)."""

    def __init__(self, model, method: Method, batch_size: int, prompt_width: int, max_new: int, device):
        cfg = model.config
        self.method = method
        self.rotary = model.get_decoder().rotary_emb
        self.L = cfg.num_hidden_layers
        self.H, self.Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.D = head_dim(cfg)
        self.dim = self.Hkv * self.D
        self.G = self.H // self.Hkv
        self.s, self.W = method.sinks, method.window
        self.B, self.max_new = batch_size, max_new
        self.length = prompt_width + max_new  # logical positions the buffers cover
        self.device = device
        self.valid = torch.zeros(batch_size, self.length, dtype=torch.bool, device=device)  # by logical position
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.compressions = 0  # S4R scores every step instead of compressing in rounds
        self.phase_seconds = dict.fromkeys(PHASES, 0.0)  # time spent in each of S4R's phases
        self.step = -1  # generated tokens whose query has attended (-1: prefill)
        self._positions = None
        self._buffers_ready = False
        self.rows = None  # the batch rows held, when finished ones have left (None: all, in order)
        self._all_bases = None  # (bases_k, bases_v) of every row, for the record, once rows have left
        self._now: DecodeStep | None = None
        # RoPE by position from a table when the rotary embedding does not depend on the sequence length
        rope_type = getattr(self.rotary, "rope_type", None)
        self._rope_static = isinstance(rope_type, str) and rope_type not in ("dynamic", "longrope")
        self._rope_table = None
        self._exact_k = method.exact in ("keys", "both")
        self._exact_v = method.exact in ("values", "both")

    # ---- engine interface ----------------------------------------------------------------------------
    @property
    def seconds(self) -> float:
        """Time spent in S4R's phases (building bases, scoring, selecting, reconstructing, attending)."""
        return sum(self.phase_seconds.values())

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
        now = self._now
        if now is not None and now.step == self.step:  # a decode step: its selections of every layer
            self._stamp_ranks(self._positions, self._valid_new)
            start = time.perf_counter()
            packed = pack_bits(F.pad(self.chosen[:, :, : now.S], (self.s, 0)))  # [L, B, bytes] over positions
            self.selected[:, slice(None) if self.rows is None else self.rows, self.step, : packed.shape[-1]] = packed
            self.phase_seconds["record"] += time.perf_counter() - start
        self.step += 1

    def forward_span(self, generated: int) -> int:
        """1: every generated token's query scores the cache and selects the tokens it attends to (one selection
        per token in the record), so every token is a compression point and a decode forward takes one."""
        return 1

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep the sequences at indices keep int64 [B'] of the rows held now; the record keeps every row."""
        if self.rows is None:
            self.rows = torch.arange(self.B, device=keep.device)
            self._all_bases = (self.bases_k, self.bases_v)  # every row's, as the rows that leave last had them
        else:
            self._sync_bases()
        self.rows, self.B = self.rows[keep], len(keep)
        state = ("sink_k", "sink_v", "bases_k", "bases_v", "coef_k", "coef_v", "cq", "window_sum", "chosen")
        state += ("recent_k", "recent_v") if self.method.refresh else ()
        state += ("exact_k",) if self._exact_k else ()
        state += ("exact_v",) if self._exact_v else ()
        for name in state:  # one at a time
            setattr(self, name, getattr(self, name).index_select(1, keep))
        for name in ("valid", "lengths", "q_pos", "q_ok", "rank_k", "rank_v", "cap_k", "cap_v", "latent_scale"):
            setattr(self, name, getattr(self, name)[keep])
        self._now = None

    def after_step(self, generated: int) -> None:
        """Refresh (``compression.refresh``): every ``refresh`` generated tokens, each layer's key and value
        bases gain ``refresh_rank`` directions from the last ``refresh`` tokens (``extend_bases``), up to each
        row's final rank; tokens written from now on use them."""
        cfg = self.method
        if not cfg.refresh or generated % cfg.refresh or generated >= self.max_new:
            return
        start = time.perf_counter()
        k = cfg.refresh_rank
        for bases, rank, cap, recent in (
            (self.bases_k, self.rank_k, self.cap_k, self.recent_k),
            (self.bases_v, self.rank_v, self.cap_v, self.recent_v),
        ):
            for b, (r, c) in enumerate(zip(rank.tolist(), cap.tolist())):
                add = min(k, c - r)
                if add <= 0:
                    continue
                for layer in range(self.L):
                    bases[layer, b] = extend_bases(bases[layer, b], r, recent[layer, b], add, cfg.normalize)
            rank.copy_(torch.minimum(rank + k, cap))
        self.phase_seconds["refresh"] += time.perf_counter() - start

    def _stamp_ranks(self, positions: torch.Tensor, valid: torch.Tensor) -> None:
        """Record the current key / value rank of each row at the logical positions [B, Q] just written."""
        rows = torch.arange(self.B, device=self.device) if self.rows is None else self.rows
        for store, rank in ((self.rank_at_k, self.rank_k), (self.rank_at_v, self.rank_v)):
            stamp = torch.where(valid, rank[:, None].to(torch.int16), store[rows[:, None], positions])
            store[rows[:, None], positions] = stamp

    def _sync_bases(self) -> None:
        """Copy the rows held now into every row's bases (refresh changes them after prefill)."""
        if self._all_bases is not None and self.method.refresh:
            self._all_bases[0][:, self.rows] = self.bases_k
            self._all_bases[1][:, self.rows] = self.bases_v

    def nbytes(self) -> int:
        """Bytes of the persistent state (per ``persistent_elements``, summed over sequences and layers), and of
        the window's score sums (G float64 per stored token)."""
        stored = int((self.lengths - self.s).clamp_min(0).sum())
        return self._persistent_elements() * 4 + self.G * stored * self.L * 8

    def _rope(self, like: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, T, D] (dtype of ``like``) at logical positions int64 [B, T], as the model's rotary module
        computes them (elementwise in the position, so a table of every position holds the same values)."""
        if not self._rope_static:
            return self.rotary(like, positions)
        table = self._table(like, positions.device)
        index = positions.reshape(-1)
        cos, sin = table[:, 0].index_select(0, index), table[:, 2].index_select(0, index)
        return cos.view(*positions.shape, -1), sin.view(*positions.shape, -1)

    def _key_rope(self, like: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """cos and the signed sin [B, T, 2, D] at positions int64 [B, T], for RoPE as
        x * cos + swap_halves(x) * signed_sin (rotate_half(x) = swap_halves(x) * (-1 on the first half))."""
        if not self._rope_static:
            cos, sin = self.rotary(like, positions)
            return torch.stack([cos, sin * self._sign(like)], dim=2)
        table = self._table(like, positions.device)
        return table[:, :2].index_select(0, positions.reshape(-1)).view(*positions.shape, 2, -1)

    def _sign(self, like: torch.Tensor) -> torch.Tensor:
        half = self.D // 2
        return torch.cat([-torch.ones(half, dtype=like.dtype), torch.ones(self.D - half, dtype=like.dtype)]).to(
            like.device
        )

    def _table(self, like: torch.Tensor, device) -> torch.Tensor:
        """[length, 3, D]: cos, the signed sin and sin of every logical position (dtype of ``like``)."""
        if self._rope_table is None or self._rope_table.dtype != like.dtype:
            cos, sin = self.rotary(like, torch.arange(self.length, device=device)[None])
            self._rope_table = torch.stack([cos[0], sin[0] * self._sign(like), sin[0]], dim=1).contiguous()
        return self._rope_table

    # ---- prefill -------------------------------------------------------------------------------------
    def _prefill(self, module, query, key, value, attention_mask, scaling):
        out = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling)
        start = time.perf_counter()
        self._build(module.layer_idx, query, key, value)
        self.phase_seconds["fit"] += time.perf_counter() - start
        return out

    def _allocate(self, dtype) -> None:
        cfg, B, L = self.method, self.B, self.L
        prompt = self.lengths  # real prompt tokens per sequence
        if bool((prompt <= self.s).any()):
            raise ValueError(f"s4r needs prompts longer than its {self.s} sinks")
        ranks = [s4r_rank(cfg.eta, self.s, self._eta_length(int(n)) - self.s, self.dim, self.G, self.W) for n in prompt]
        # the rank each row ends with (its coefficient buffers' width); with refresh it starts short of it by the
        # columns the refreshes will add, so that the budget is kept
        split = [split_rank(r, cfg.rank_ratio, self.dim) for r in ranks]  # (r_k, r_v) per row
        self.cap_k = torch.tensor([cfg.rank or k for k, _ in split], device=self.device).clamp_max(self.dim)
        self.cap_v = torch.tensor([cfg.rank_v or cfg.rank or v for _, v in split], device=self.device).clamp_max(
            self.dim
        )
        added = cfg.refresh_rank * ((self.max_new - 1) // cfg.refresh) if cfg.refresh else 0
        self.rank_k, self.rank_v = (self.cap_k - added).clamp_min(1), (self.cap_v - added).clamp_min(1)  # now
        self._ranks = (self.cap_k, self.cap_v)  # of every row (rows that finish leave the buffers)
        rk, rv, S = int(self.cap_k.max()), int(self.cap_v.max()), self.length - self.s
        f32 = dict(dtype=torch.float32, device=self.device)
        self.sink_k = torch.zeros(L, B, self.Hkv, self.s, self.D, dtype=dtype, device=self.device)
        self.sink_v = torch.zeros_like(self.sink_k)
        self.bases_k, self.bases_v = torch.zeros(L, B, self.dim, rk, **f32), torch.zeros(L, B, self.dim, rv, **f32)
        self.coef_k, self.coef_v = torch.zeros(L, B, S, rk, **f32), torch.zeros(L, B, S, rv, **f32)
        self.cq = torch.zeros(L, B, self.G, self.W, rk, **f32)
        # the sum over the window of its queries' softmaxes, in float64: adding a query's probabilities and later
        # subtracting them leaves a rounding residue, which float64 keeps far below float32's resolution, so the
        # score does not depend on the rounding of queries long gone (e.g. under a different batch size)
        self.window_sum = torch.zeros(L, B, self.G, S, dtype=torch.float64, device=self.device)
        self.latent_scale = self.cap_k.float().rsqrt()[:, None, None, None]  # [B, 1, 1, 1]
        # the key and value rank each position was written with (every row of the batch, by logical position)
        self.rank_at_k = torch.zeros(B, self.length, dtype=torch.int16, device=self.device)
        self.rank_at_v = torch.zeros_like(self.rank_at_k)
        # the control's exact keys (after RoPE) and values of every non-sink token, by slot: [L, B, Hkv, S, D]
        exact = dict(size=(L, B, self.Hkv, S, self.D), dtype=dtype, device=self.device)
        self.exact_k = torch.zeros(**exact) if self._exact_k else None
        self.exact_v = torch.zeros(**exact) if self._exact_v else None
        if cfg.refresh:  # the last ``refresh`` tokens' pre-RoPE keys and values, for the next refresh
            self.recent_k = torch.zeros(L, B, cfg.refresh, self.dim, **f32)
            self.recent_v = torch.zeros_like(self.recent_k)
        self.q_pos = torch.zeros(B, self.W, dtype=torch.long, device=self.device)
        self.q_ok = torch.zeros(B, self.W, dtype=torch.bool, device=self.device)
        # Bit-packed selection of every layer and generated token, over logical positions.
        self.selected = torch.zeros(L, B, self.max_new, (self.length + 7) // 8, dtype=torch.uint8, device=self.device)
        self.chosen = torch.zeros(L, B, S, dtype=torch.bool, device=self.device)  # this step's, by slot
        self._buffers_ready = True

    def _eta_length(self, prompt: int) -> int:
        """The sequence length at which the persistent memory is the share ``eta`` (``expected_length``)."""
        expected = self.method.expected_length
        if expected is None:
            return prompt + self.max_new
        return max(prompt, expected)  # 0 (or a length below the prompt's): at the prompt

    def _build(self, layer, query, key, value) -> None:
        """Sinks, bases, coefficients of every prompt token and the projected query window of one layer."""
        if not self._buffers_ready:
            self._allocate(key.dtype)
        cfg, pos, valid = self.method, self._positions, self._valid_new
        cos, sin = self._rope(value, pos)
        k_pre = heads_to_concat(inverse_rope(key, cos, sin)).float()  # [B, P, D']
        v_cat = heads_to_concat(value).float()
        q_pre = group_queries(inverse_rope(query, cos, sin), self.Hkv).float()  # [B, G, P, D']
        rk, rv = self.bases_k.shape[-1], self.bases_v.shape[-1]
        for b in range(self.B):
            cols = valid[b].nonzero().squeeze(-1)  # real prompt columns, in position order
            sink_cols, rest = cols[: self.s], cols[self.s :]
            self.sink_k[layer, b] = key[b][:, sink_cols]
            self.sink_v[layer, b] = value[b][:, sink_cols]
            slots_b = pos[b, rest] - self.s
            if self._exact_k:
                self.exact_k[layer, b][:, slots_b] = key[b][:, rest]
            if self._exact_v:
                self.exact_v[layer, b][:, slots_b] = value[b][:, rest]
            if cfg.basis == "prompt":
                sampled = rest
            else:
                # at least as many samples as the key rank (and the value rank when rank_ratio makes it larger)
                floor = max(int(self.rank_k[b]), int(self.rank_v[b]) if cfg.rank_ratio != 1 else 0)
                count = max(round(cfg.eta * len(rest)), floor)
                sampled = rest[sample_positions(len(rest), count, cfg.recent_ratio)]
            self.bases_k[layer, b] = torch.nn.functional.pad(
                low_rank_bases(k_pre[b, sampled][None], int(self.rank_k[b]), cfg.normalize)[0],
                (0, rk - int(self.rank_k[b])),
            )
            self.bases_v[layer, b] = torch.nn.functional.pad(
                low_rank_bases(v_cat[b, sampled][None], int(self.rank_v[b]), cfg.normalize)[0],
                (0, rv - int(self.rank_v[b])),
            )
        if layer == 0:
            self._stamp_ranks(pos, valid)
        slots = (pos - self.s).clamp_min(0)  # [B, P]
        keep = (valid & (pos >= self.s))[..., None]
        ck = (k_pre @ self.bases_k[layer]) * keep
        cv = (v_cat @ self.bases_v[layer]) * keep
        self.coef_k[layer].scatter_add_(1, slots[..., None].expand_as(ck), ck)
        self.coef_v[layer].scatter_add_(1, slots[..., None].expand_as(cv), cv)
        self._push_queries(layer, q_pre[:, :, -self.W :], pos[:, -self.W :], (valid & (pos >= self.s))[:, -self.W :])
        S = int(self.lengths.max()) - self.s
        k_pos = torch.arange(self.s, self.s + S, device=pos.device).expand(self.B, -1)
        hidden = hidden_keys(self.q_pos, self.q_ok, k_pos, self.valid[:, self.s : self.s + S])
        probs = latent_probs(self.cq[layer], self.coef_k[layer][:, :S], self.latent_scale, key_bias(hidden, self.G))
        self.window_sum[layer][:, :, :S] = (self.q_ok.double()[:, None, None, :] @ probs.double()).squeeze(2)

    def _push_queries(self, layer, q_pre, pos, ok) -> None:
        """Fill the window with the prefill's last projected queries q_pre [B, G, n, D'] (n <= W), oldest first:
        decode step t then replaces slot t mod W, the oldest. ok bool [B, n]: the scoring queries, real and past
        the sinks (a query at a sink position sees no stored key: it takes no part in the scores)."""
        n = q_pre.shape[2]
        cq = q_pre @ self.bases_k[layer][:, None]  # [B, G, n, r]
        self.cq[layer] = torch.cat([self.cq[layer][:, :, n:], cq], dim=2)[:, :, -self.W :]
        if layer == 0:
            self.q_pos = torch.cat([self.q_pos[:, n:], pos], dim=1)[:, -self.W :]
            self.q_ok = torch.cat([self.q_ok[:, n:], ok], dim=1)[:, -self.W :]

    # ---- decode --------------------------------------------------------------------------------------
    def _begin_step(self, like: torch.Tensor) -> DecodeStep:
        """The new token's RoPE, slot and window place, the queries entering and leaving the window, the
        slots to score, the selection budget and the attention mask."""
        pos = self._positions  # [B, 1]
        cos, sin = self._rope(like, pos)
        ring = self.step % self.W
        pair_pos = torch.stack([pos[:, 0], self.q_pos[:, ring]], dim=1)
        pair_ok = torch.stack([self._valid_new[:, 0], self.q_ok[:, ring]], dim=1)
        self.q_pos[:, ring], self.q_ok[:, ring] = pos[:, 0], self._valid_new[:, 0]
        S = int(pos.max()) + 1 - self.s
        k_pos = torch.arange(self.s, self.s + S, device=pos.device).expand(self.B, -1)
        k_ok = self.valid[:, self.s : self.s + S] & (k_pos <= pos)
        sign = torch.tensor([1.0, -1.0], dtype=torch.float64, device=pos.device)
        pair_weight = (pair_ok.double() * sign)[:, :, None, None]
        budget = selection_budget(k_pos, k_ok, pos[:, 0], self.W, self.method.rho)
        full = None
        if self.method.full_layers:
            count = k_ok.sum(-1)
            full = int(count.max()), self._attention_mask(count, int(count.max()))
        return DecodeStep(
            self.step,
            cos,
            sin,
            (pos - self.s)[..., None],
            ring,
            S,
            k_ok,
            key_bias(hidden_keys(pair_pos, pair_ok, k_pos, k_ok), self.G),
            pair_weight,
            budget,
            self._attention_mask(budget.count, budget.n),
            full,
            torch.arange(self.B, device=pos.device)[:, None] * self.coef_k.shape[2],
        )  # the slot: prompts are longer than the sinks, so every generated token is stored low-rank

    def _attention_mask(self, count: torch.Tensor, n: int) -> torch.Tensor | None:
        """bool [B, s + n]: the sinks and each row's first count [B] reconstructed slots; None when all are."""
        if bool((count == n).all()):
            return None
        return F.pad(torch.arange(n, device=count.device)[None, :] < count[:, None], (self.s, 0), value=True)

    def _decode(self, module, query, key, value, scaling):
        start = time.perf_counter()
        layer, cfg, now = module.layer_idx, self.method, self._now
        if now is None or now.step != self.step:
            now = self._now = self._begin_step(value)
        B, G, Hkv, D = self.B, self.G, self.Hkv, self.D
        coef_k, coef_v, bases_k, bases_v = (
            self.coef_k[layer],
            self.coef_v[layer],
            self.bases_k[layer],
            self.bases_v[layer],
        )

        # The new token's pre-RoPE query and key (rotated back together) onto B_K, its value onto B_V.
        pre = inverse_rope(torch.cat([query, key], dim=1), now.cos, now.sin).float()  # [B, H + Hkv, 1, D]
        pre = torch.cat([group_queries(pre[:, : self.H], Hkv), heads_to_concat(pre[:, self.H :])[:, None]], dim=1)
        proj = pre @ bases_k[:, None]  # [B, G + 1, 1, r]: the G query members, then the key
        v_cat = heads_to_concat(value).float()  # [B, 1, D']
        coef_k.scatter_(1, now.slot.expand(-1, -1, coef_k.shape[-1]), proj[:, G])
        coef_v.scatter_(1, now.slot.expand(-1, -1, coef_v.shape[-1]), v_cat @ bases_v)
        batch = torch.arange(B, device=key.device)
        if self._exact_k:
            self.exact_k[layer, batch, :, now.slot.view(B)] = key[:, :, 0]
        if self._exact_v:
            self.exact_v[layer, batch, :, now.slot.view(B)] = value[:, :, 0]
        if cfg.refresh:
            self.recent_k[layer, :, self.step % cfg.refresh] = pre[:, G, 0]
            self.recent_v[layer, :, self.step % cfg.refresh] = v_cat[:, 0]
        pair = torch.cat([proj[:, :G], self.cq[layer, :, :, now.ring, None]], dim=2)  # [B, G, 2, r]: in, out
        self.cq[layer, :, :, now.ring] = proj[:, :G, 0]

        # Score the non-sink cache in the latent space: the window's sum of softmaxes (the mean times the number
        # of valid queries, the same order) moves by the query entering and the one leaving.
        probs = latent_probs(pair, coef_k[:, : now.S], self.latent_scale, now.pair_bias)  # [B, G, 2, S]
        window_sum = self.window_sum[layer][:, :, : now.S]  # [B, G, S]
        window_sum.addcmul_(probs[:, :, 0].double(), now.pair_weight[:, 0]).addcmul_(
            probs[:, :, 1].double(), now.pair_weight[:, 1]
        )
        score = window_sum.float()
        # scores outside k_ok are 0 (nothing was ever added there), so max pooling needs no mask
        ok = None if cfg.pool == "max" else now.k_ok[:, None, :]
        score = aggregate_group(pool_scores(score, ok, cfg.pool_kernel, cfg.pool), 1, cfg.group_agg)
        if layer in cfg.full_layers:
            chosen, (n, mask) = now.k_ok, now.full
        else:
            chosen, n, mask = select_tokens(score, now.budget), now.budget.n, now.mask
        self.chosen[layer, :, : now.S] = chosen  # packed into the record once per step (``end``)
        scored = time.perf_counter()
        self.phase_seconds["score"] += scored - start

        # Reconstruct the chosen keys (C B_K^T, RoPE at their positions) and attend with the sinks.
        order = chosen_in_order(chosen, n)  # [B, n]
        rows = (order + now.row_offsets).view(-1)
        ck = coef_k.view(-1, coef_k.shape[-1]).index_select(0, rows).view(B, n, -1)
        cv = coef_v.view(-1, coef_v.shape[-1]).index_select(0, rows).view(B, n, -1)
        x = (ck[:, None] @ bases_k.view(B, Hkv, D, -1).transpose(-1, -2)).to(key.dtype)  # [B, Hkv, n, D]
        rope = self._key_rope(x, order + self.s)[:, None]  # [B, 1, n, 2, D]: cos, signed sin
        swapped = x.view(B, Hkv, n, 2, D // 2).flip(-2).view(B, Hkv, n, D)
        keys = torch.addcmul(x * rope[..., 0, :], swapped, rope[..., 1, :])  # RoPE at their positions
        if self._exact_k:  # the control: the chosen tokens' exact keys
            keys = self.exact_k[layer][batch[:, None], :, order].transpose(1, 2)  # [B, Hkv, n, D]
        values = self.exact_v[layer][batch[:, None], :, order].transpose(1, 2) if self._exact_v else None
        built = time.perf_counter()
        self.phase_seconds["reconstruct"] += built - scored
        out = self._attend(query, self.sink_k[layer], keys, self.sink_v[layer], cv, bases_v, mask, scaling, values)
        self.phase_seconds["attend"] += time.perf_counter() - built
        return out, None

    def _attend(self, query, sink_k, keys, sink_v, cv, bases_v, mask, scaling, values=None) -> torch.Tensor:
        """The new token's attention output [B, 1, H, D] (the attention interface's layout) from queries
        [B, H, 1, D] over the exact sink keys sink_k [B, Hkv, s, D] and the reconstructed keys [B, Hkv, n, D]
        (mask bool [B, s + n] or None), with exact sink values sink_v [B, Hkv, s, D] and the reconstructed
        tokens' values taken in the latent space: the weights a of a query head give
        sum_j a_j C_V[j] B_V^T = (a C_V) B_V^T, restricted to its KV head's columns, so no value is
        reconstructed. cv [B, n, r_v] coefficients, bases_v [B, D', r_v]; values [B, Hkv, n, D]: the chosen tokens'
        exact values instead (the ``exact`` control). Computed in float32."""
        B, H, _, D = query.shape
        Hkv, G, s = self.Hkv, self.G, self.s
        scale = D**-0.5 if scaling is None else scaling
        q = query.float().view(B, Hkv, G, D) * scale
        logits = torch.cat([q @ sink_k.float().transpose(-1, -2), q @ keys.float().transpose(-1, -2)], dim=-1)
        if mask is not None:
            logits.masked_fill_(~mask[:, None, None, :], float("-inf"))
        weights = logits.softmax(-1)
        out = weights[..., :s] @ sink_v.float()  # [B, Hkv, G, D]
        if values is not None:
            return (out + weights[..., s:] @ values.float()).to(query.dtype).view(B, 1, H, D)
        latent = weights[..., s:].reshape(B, H, -1) @ cv  # [B, H, r_v]
        per_head = bases_v.transpose(-1, -2).view(B, -1, Hkv, D).transpose(1, 2)  # [B, Hkv, r_v, D]
        out = out + latent.view(B, Hkv, G, -1) @ per_head
        return out.to(query.dtype).view(B, 1, H, D)

    # ---- results -------------------------------------------------------------------------------------
    def finish(self, prompt_lengths, completion_lengths, width: int):
        """(record, retention): the ``S4RRecord`` (selections of the generated tokens, positions < width) and the
        tokens the last decoding query attended to (sinks + reconstructed) / sequence length, mean over layers."""
        steps, N = int(completion_lengths.max()), completion_lengths.shape[0]
        self._sync_bases()
        bases_k, bases_v = (self.bases_k, self.bases_v) if self._all_bases is None else self._all_bases
        selected = self.selected[:, :, :steps, : (width + 7) // 8].transpose(0, 1).clone()
        # canonical: no selection for steps past a sequence's end (decoded only while its batch went on)
        past_end = torch.arange(steps, device=self.device)[None, :] >= (completion_lengths - 1)[:, None]
        selected[past_end[:, None, :, None].expand_as(selected)] = 0
        # canonical too: no rank for positions never written (past each sequence's end; its last sampled token is
        # never fed), and no basis column no written token uses (a row that decoded on past its end, as happens
        # when finished rows stay in the batch, refreshed from tokens that are not its own)
        total = prompt_lengths + completion_lengths
        written = torch.arange(width, device=self.device)[None, :] < (total - 1)[:, None]
        key_rank, value_rank = (r[:, :width] * written for r in (self.rank_at_k, self.rank_at_v))
        # the control: exact states are an identity basis at full rank (S I I^T = S), so training reads them so too
        identity = torch.eye(self.dim, device=self.device).expand(self.L, bases_k.shape[1], -1, -1)
        full = (written * self.dim).to(self.rank_at_k.dtype)
        if self._exact_k:
            bases_k, key_rank = identity, full
        if self._exact_v:
            bases_v, value_rank = identity, full
        bases_k, bases_v = (
            b.transpose(0, 1) * (torch.arange(b.shape[-1], device=self.device) < r.amax(1)[:, None, None, None])
            for b, r in ((bases_k, key_rank), (bases_v, value_rank))
        )
        record = S4RRecord(
            bases_k=bases_k.contiguous(),
            bases_v=bases_v.contiguous(),
            selected=selected,
            prompt_lengths=prompt_lengths.clone(),
            sinks=torch.full((N,), self.s, dtype=torch.long, device=self.device),
            key_rank=key_rank,
            value_rank=value_rank,
        )
        last = (completion_lengths - 2).clamp_min(0)  # the last generated token whose query attended
        rows = selected.transpose(0, 1)[:, torch.arange(N), last]  # [L, B, bytes]
        counts = unpack_bits(rows, rows.shape[-1] * 8).sum(-1).float().mean(0)
        retention = ((counts + self.s) / total.float()).clamp_max(1.0)
        # a one-token completion: only the prefill's queries attended, to every prompt token
        return record, torch.where(completion_lengths < 2, 1.0, retention)

    def memory_share(self, prompt_lengths, completion_lengths, retention):
        """float32 [N]: each sequence's persistent state at its end (``persistent_elements`` at its length) over
        the full KV cache of the same tokens (2 T D' numbers per layer)."""
        total = (prompt_lengths + completion_lengths).tolist()
        rank_k, rank_v = (r.tolist() for r in self._ranks)
        shares = [
            persistent_elements(self.s, max(T - self.s, 0), self.dim, self.G, self.W, rk, rv, self.method.refresh)
            / (2 * T * self.dim)
            for T, rk, rv in zip(total, rank_k, rank_v)
        ]
        return torch.tensor(shares, dtype=torch.float32, device=retention.device)

    def _persistent_elements(self) -> int:
        return (
            sum(
                persistent_elements(
                    self.s,
                    int(n) - self.s,
                    self.dim,
                    self.G,
                    self.W,
                    int(rk),
                    int(rv),
                    self.method.refresh,
                )
                for n, rk, rv in zip(self.lengths, self.cap_k, self.cap_v)
            )
            * self.L
        )
