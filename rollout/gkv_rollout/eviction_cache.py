"""The rollout's KV cache: preallocated per-layer buffers, compressed in place, that write the eviction record.

``EvictionCache`` is the attention context (``gkv_rollout.contract.attention``) of the rollout's forward calls:
each layer appends its new keys/values (after RoPE) to its buffer, keeps the last ``window`` queries for scoring, and
attends over the occupied slots. Every slot carries the logical position of its token, so eviction never
shifts a RoPE position, and ``compress`` keeps, per layer and KV head, the sinks (or the prompt), the window and the
best scored others, compacting them into the first ``budget`` slots in position order and stamping the evicted ones
in the record (see ``gkv_rollout.contract.eviction`` for the timing).

Occupancy is per sequence, not per layer or head: after a compression every (layer, KV head) of sequence ``b``
keeps exactly ``min(budget, length_b)`` tokens, so one [B, S] validity mask serves all layers.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from gkv_rollout.contract.attention import head_dim
from gkv_rollout.contract.eviction import NEVER, EvictionRecord, after_end_is_never
from gkv_rollout.kv_cache import KVCache
from gkv_rollout.scoring import LayerState, candidate_slots, check_finite, checked_score, select_keep

STATIC_WIDTH_STEP = 64  # a static decode step attends over a multiple of this many slots
# given tokens a forward of the full cache takes at most (it has no compression point to stop at): its attention
# scores are span x cache wide per head, a span of decode steps' worth (the whole cache wide for a long replay
# otherwise), while the per-forward overhead that chunking saves is already shared by this many tokens; G-KV's
# default interval, the most a compressing cache's forward takes by default
FULL_SPAN = 128


def gather_slots(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [B, H, S, *rest] (contiguous: a whole buffer, so that no copy is made to index it), index int64 [B, H, K]
    (slots < S) -> x at those slots, [B, H, K, *rest].

    A flat ``index_select``: several times faster on CPU than ``torch.gather`` with an expanded index.
    """
    B, H, S = x.shape[:3]
    rest = x.shape[3:]
    base = torch.arange(B * H, device=x.device)[:, None] * S
    flat = (index.reshape(B * H, -1) + base).reshape(-1)
    return x.reshape(B * H * S, *rest).index_select(0, flat).view(B, H, index.shape[-1], *rest)


def decode_attention(query, keys, values, mask, scaling):
    """One decode query per sequence over a buffer prefix, grouped-query without copying the keys.

    query [B, H, 1, D]; keys/values [B, Hkv, W, D]; mask bool [B, 1, 1, W]. The H = Hkv x G query heads are
    folded into Hkv groups of G queries (query head h reads KV head h // G, as ``repeat_kv`` assigns them).
    Returns (out [B, 1, H, D], None).
    """
    B, H, _, D = query.shape
    Hkv = keys.shape[1]
    out = F.scaled_dot_product_attention(
        query.reshape(B, Hkv, H // Hkv, D), keys, values, attn_mask=mask, scale=scaling
    )
    return out.reshape(B, 1, H, D), None


class EvictionCache(KVCache):
    """KV buffers of one batched rollout.

    model_config: the HF config (layers, heads, head dim); method: the method at its settings (``full`` or
    one of the G-KV family: ``gkv_rollout.methods``, which builds this cache and sits above it), of which the cache
    reads ``compresses``, ``budget``, ``window``, ``interval``, ``sinks`` and ``keep_prompt`` and calls ``score``
    (a compression) and ``check_kept_prompt``; capacity: slots per buffer; record_len: logical
    positions the record covers (longest prompt + max new tokens); seed: the rollout's sampling seed (for a
    method that draws at random).
    """

    static_decode = True  # ``begin(..., static=True)`` is supported

    def __init__(
        self,
        model_config,
        method,
        batch_size: int,
        capacity: int,
        record_len: int,
        dtype: torch.dtype,
        device: torch.device,
        seed: int = 0,
    ):
        self.method = method  # at its settings
        self.seed = seed
        L = model_config.num_hidden_layers
        H = model_config.num_attention_heads
        Hkv = model_config.num_key_value_heads
        D = head_dim(model_config)
        B, S = batch_size, capacity
        self.scale = D**-0.5
        # one buffer per layer [B, Hkv, S, D], so that a compiled step writes a layer's buffer, not a view of all
        self.keys = [torch.zeros(B, Hkv, S, D, dtype=dtype, device=device) for _ in range(L)]
        self.values = [torch.zeros(B, Hkv, S, D, dtype=dtype, device=device) for _ in range(L)]
        self.valid = torch.zeros(B, S, dtype=torch.bool, device=device)
        self.lengths = torch.zeros(B, dtype=torch.long, device=device)  # tokens seen = next logical position
        # each sequence's prompt length, set after the prefill (what ``keep_prompt`` keeps; 0: nothing yet)
        self.prompt_lengths = torch.zeros(B, dtype=torch.long, device=device)
        self.used = 0  # occupied prefix of the buffers (some slots in it may be empty for some sequences)
        self._pending = 0  # slots being written by the forward in flight
        self.compressions = 0
        self.seconds = 0.0  # time spent compressing
        self.score_seconds = 0.0  # the part of it spent in the method's scores (the rest: selection and eviction)
        self.evict_at = None
        self.queries = None  # the last ``window`` queries per layer, when the method compresses
        self.rows = None  # the batch rows held, when finished ones have left (None: all, in order)
        self.left_length = 0  # the length the longest row that left would have now (it would still be fed)
        self.static = False  # the forward in flight has static shapes (``begin(..., static=True)``)
        self._slot = torch.zeros(1, dtype=torch.long, device=device)  # static: the new token's slot
        self._ring_slot = torch.zeros(1, dtype=torch.long, device=device)  # static: its query's window slot
        if method.compresses:
            W = method.window
            self.positions = torch.zeros(L, B, Hkv, S, dtype=torch.long, device=device)
            # each token's global score from the last compression; NaN: none (new since, or in the window then)
            self.history = torch.full((L, B, Hkv, S), float("nan"), dtype=torch.float32, device=device)
            self.queries = [torch.zeros(B, H, W, D, dtype=dtype, device=device) for _ in range(L)]
            self.query_pos = torch.zeros(B, W, dtype=torch.long, device=device)
            self.query_ok = torch.zeros(B, W, dtype=torch.bool, device=device)
            self._query_slot = 0  # the window slot of the next query
            self._ring = None  # the window slots of the forward in flight's last queries
            # the eviction stamps, layer first: [L, B, Hkv, T] (``finish`` returns them as an EvictionRecord)
            self.evict_at = torch.full((L, B, Hkv, record_len), NEVER, dtype=torch.int32, device=device)

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def nbytes(self) -> int:
        """Bytes held by the key/value buffers."""
        return sum(k.numel() * k.element_size() for k in self.keys) * 2

    @property
    def phase_seconds(self) -> dict[str, float]:
        """``seconds`` in two phases: ``score`` (the candidate slots and the method's score of every layer, checked)
        and ``evict`` (selecting the kept slots, stamping the record, moving the kept keys, values, positions and
        history)."""
        return {"score": self.score_seconds, "evict": self.seconds - self.score_seconds}

    def begin(self, positions: torch.Tensor, valid: torch.Tensor, static: bool = False) -> torch.Tensor:
        """Reserve slots for the next forward's Q new tokens; returns its attention mask.

        positions int64 [B, Q] logical positions of the new tokens; valid bool [B, Q] (False for padding).
        Returns bool [B, 1, Q, used + Q]: every occupied slot for every query, causal inside the new tokens;
        a padding query also sees itself so that no row is empty.

        static: a one-token decode step whose shapes do not follow the cache's fill (``compile_decode``): the
        mask is bool [B, 1, 1, W] over the first W = ``static_width(used + 1)`` slots, the new slot included,
        and ``attend`` writes at the slot held in a tensor. Prompt forwards are never static.
        """
        Q = positions.shape[1]
        self.static = static
        if static:
            if Q != 1:
                raise ValueError(f"a static forward is a one-token decode step, got {Q} tokens")
            self._slot.fill_(self.used)
            if self.method.compresses:
                self._ring_slot.fill_(self._query_slot)
        start, end = self.used, self.used + Q
        if end > self.capacity:
            raise RuntimeError(f"rollout cache overflow: {end} slots needed, {self.capacity} allocated")
        self.valid[:, start:end] = valid
        self.lengths += valid.sum(-1)
        self.left_length += Q if self.left_length else 0
        self._pending = Q
        if self.method.compresses:
            self.positions[..., start:end] = positions[None, :, None, :]
            # ``used`` is 0 only before the prompt's forward: forwards add to it, a compression leaves the K >= 1
            # slots it keeps, rows leaving keep the slots' width
            self._ring = self.ring_slots(Q, first=start == 0)
            self.query_pos[:, self._ring] = positions[:, -len(self._ring) :]
            self.query_ok[:, self._ring] = valid[:, -len(self._ring) :]
        if static:
            return self.valid[:, None, None, : self.static_width(end)]
        new = torch.arange(Q, device=positions.device)
        cols = torch.arange(end, device=positions.device)
        causal = cols[None, :] <= (start + new)[:, None]
        mask = (self.valid[:, None, :end] & causal) | (cols[None, :] == (start + new)[:, None])
        return mask[:, None]

    def ring_slots(self, Q: int, first: bool) -> torch.Tensor:
        """The window slots int64 [min(W, Q)] of the last queries of a forward of Q tokens: query t of the forward
        takes slot (``_query_slot`` + t) mod W, as when the tokens go through one by one, so the window holds its
        queries in the same slots however the tokens were grouped into forwards (and the scores' sums over the
        window run in the same order). ``first``: the prompt's forward (the same whether later tokens are
        chunked or not), whose last queries fill the ring from slot 0 in order, as they did before given tokens
        were chunked (so that one token per forward gives the records it gave then)."""
        W = self.query_pos.shape[1]
        kept = min(W, Q)
        if first:
            self._query_slot = (kept - Q) % W
        return (self._query_slot + torch.arange(Q - kept, Q, device=self.query_pos.device)) % W

    def step_buffers(self) -> list[torch.Tensor]:
        """The tensors a static decode step writes in place (for CUDA graphs: their addresses are fixed)."""
        return [*self.keys, *self.values, *(self.queries or []), self._slot, self._ring_slot]

    def static_width(self, end: int) -> int:
        """Slots a static decode step attends over when ``end`` are in use: ``end`` rounded up to a multiple of
        ``STATIC_WIDTH_STEP`` (at most the capacity), so that shapes change rarely (and a CUDA graph is
        captured for a few widths only)."""
        return min(self.capacity, -(-end // STATIC_WIDTH_STEP) * STATIC_WIDTH_STEP)

    def attend(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0):
        """Append this layer's new keys/values, remember its last queries, and attend over the occupied slots."""
        layer, Q = module.layer_idx, query.shape[2]
        keys, values = self.keys[layer], self.values[layer]
        if self.static:  # only tensors index the buffers: nothing here changes from one step to the next
            # (under bf16 autocast the new states are bf16 while the buffers keep the model's dtype)
            keys.index_copy_(2, self._slot, key.to(keys.dtype))
            values.index_copy_(2, self._slot, value.to(values.dtype))
            if self.queries is not None:  # a plain attribute: no guard on the method's name
                self.queries[layer].index_copy_(2, self._ring_slot, query.to(self.queries[layer].dtype))
            width = attention_mask.shape[-1]
            return decode_attention(query, keys[:, :, :width], values[:, :, :width], attention_mask, scaling)
        start, end = self.used, self.used + Q
        keys[:, :, start:end] = key
        values[:, :, start:end] = value
        if self.method.compresses:
            self.queries[layer][:, :, self._ring] = query[:, :, -len(self._ring) :]
        return sdpa_attention_forward(
            module, query, keys[:, :, :end], values[:, :, :end], attention_mask, scaling=scaling
        )

    def end(self) -> None:
        """Commit the slots written by the forward that just ran."""
        if self.method.compresses:
            self._query_slot = (self._query_slot + self._pending) % self.queries[0].shape[2]
        self.used += self._pending
        self._pending = 0

    def over_budget(self) -> bool:
        """Whether a sequence of the batch, held or left, exceeds the budget. Rows that left count: a
        compression compacts every row's slots, which changes how later top-k ties are broken, so compressions
        run at the same steps whether finished rows are kept to the end or not."""
        return bool((self.lengths > self.method.budget).any()) or self.left_length > self.method.budget

    def after_prefill(self) -> None:
        """Note each sequence's prompt length (the tokens seen so far); compress right after prefill when a prompt
        exceeds the budget. With ``keep_prompt``, ValueError when a prompt fills the budget (the job's checks
        refuse it before any work; a direct call of the engine here, before any token is generated)."""
        if not self.method.compresses:
            return
        self.prompt_lengths = self.lengths.clone()
        if self.method.keep_prompt:
            longest = int(self.prompt_lengths.argmax())
            self.method.check_kept_prompt(int(self.prompt_lengths[longest]), f"the prompt of row {longest}")
        if self.over_budget():
            self.compress()

    def after_step(self, generated: int) -> None:
        """Compress after every ``interval``-th generated token's forward (when a sequence is over budget)."""
        if self.method.compresses and generated % self.method.interval == 0 and self.over_budget():
            self.compress()

    def forward_span(self, generated: int) -> int:
        """Tokens per sequence the next decode forward may take: up to the next compression point (the next
        multiple of ``interval`` generated tokens); without compression, ``FULL_SPAN`` (within the buffers)."""
        if not self.method.compresses:
            return min(FULL_SPAN, self.capacity - self.used)
        return self.method.interval - generated % self.method.interval

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep the sequences at indices keep int64 [B'] of the rows held now; the record keeps every row."""
        held = torch.arange(self.valid.shape[0], device=keep.device) if self.rows is None else self.rows
        self.rows = held[keep]
        leaving = torch.ones_like(self.lengths, dtype=torch.bool).index_fill_(0, keep, False)
        if bool(leaving.any()):
            self.left_length = max(self.left_length, int(self.lengths[leaving].max()))
        # one buffer at a time, so that the cache never needs much more than its size while it shrinks
        buffers = (self.keys, self.values) + ((self.queries,) if self.method.compresses else ())
        for layers in buffers:
            for layer, x in enumerate(layers):
                layers[layer] = x.index_select(0, keep)
        self.valid, self.lengths, self.prompt_lengths = self.valid[keep], self.lengths[keep], self.prompt_lengths[keep]
        if self.method.compresses:
            self.positions = self.positions.index_select(1, keep)
            self.history = self.history.index_select(1, keep)
            self.query_pos, self.query_ok = self.query_pos[keep], self.query_ok[keep]

    def finish(self, prompt_lengths, completion_lengths, width: int):
        """(record, retention) of the rollout: an ``EvictionRecord`` of ``evict_at`` [N, L, Hkv, width] (None
        without compression) and cache length / sequence length at each sequence's last token."""
        total = prompt_lengths + completion_lengths
        if self.evict_at is None:
            return None, torch.ones(total.shape[0], dtype=torch.float32, device=total.device)
        record = EvictionRecord(after_end_is_never(self.evict_at[..., :width].permute(1, 0, 2, 3), total))
        return record, record.retention(total)

    def compress(self) -> None:
        """Keep ``min(budget, length)`` tokens per (sequence, layer, KV head), its sinks (or its prompt) and window
        among them; stamp the evicted ones.

        The stamp is each sequence's current length: the logical position of its next query, the first that
        no longer sees them.
        """
        start = time.perf_counter()
        cfg, S = self.method, self.used
        key_ok, stamp = self.valid[:, :S], self.lengths.to(torch.int32)
        positions, history = self.positions[..., :S], self.history[..., :S]  # [L, B, Hkv, S]
        L, B, Hkv, _ = positions.shape
        kept_front = self.prompt_lengths.clamp_min(cfg.sinks) if cfg.keep_prompt else cfg.sinks
        candidates = candidate_slots(positions, key_ok, self.lengths, cfg.window, kept_front)
        # each layer's score; what follows (selection, record, positions, history) runs for all layers at once.
        # (What a sequence keeps depends on its batch only through top-k ties: the slots' layout follows the
        # batch's compressions.)
        scores, histories = [], []
        rows = torch.arange(B, device=stamp.device) if self.rows is None else self.rows
        for layer in range(L):
            state = LayerState(
                self.queries[layer].view(B, Hkv, -1, self.query_pos.shape[1], self.keys[layer].shape[-1]),
                self.query_pos,
                self.query_ok,
                self.keys[layer][:, :, :S],
                positions[layer],
                key_ok,
                candidates[layer],
                history[layer],
                self.scale,
                layer,
                rows,
                self.lengths,
                self.seed,
            )
            score, new_history = checked_score(self.method, state, None if layer == 0 else histories[0] is not None)
            scores.append(score)
            histories.append(new_history)
        scores = torch.stack(scores)
        check_finite(self.method, scores, candidates)  # (its host sync ends the scores' kernels on a GPU)
        self.score_seconds += time.perf_counter() - start
        index, n_keep = select_keep(scores, candidates, key_ok, cfg.budget, cfg.window)  # [L, B, Hkv, K]
        K = index.shape[-1]
        kept = torch.zeros_like(positions, dtype=torch.bool).scatter_(
            -1, index, (torch.arange(K, device=index.device) >= (K - n_keep)[:, None, None]).expand_as(index)
        )
        stamps = torch.where(key_ok[:, None, :] & ~kept, stamp[:, None, None], NEVER)
        record = self.evict_at if self.rows is None else self.evict_at.index_select(1, self.rows)
        record.scatter_reduce_(-1, positions.clamp_max(self.evict_at.shape[-1] - 1), stamps, "amin")
        if self.rows is not None:
            self.evict_at.index_copy_(1, self.rows, record)
        for layer in range(L):
            self.keys[layer][:, :, :K] = gather_slots(self.keys[layer], index[layer])
            self.values[layer][:, :, :K] = gather_slots(self.values[layer], index[layer])
        self.positions[..., :K] = positions.gather(-1, index)
        if histories[0] is not None:
            # Sequences within budget lose nothing and keep their score history untouched; only the scored tokens
            # carry their score on, the window's start afresh, as in the reference.
            new_history = torch.stack(histories).masked_fill(~candidates, float("nan"))
            active = (self.lengths > cfg.budget)[:, None, None]
            self.history[..., :K] = torch.where(active, new_history, history).gather(-1, index)
        self.history[..., K:] = float("nan")
        self.valid[:, :K] = torch.arange(K, device=self.valid.device) >= (K - n_keep)[:, None]
        self.valid[:, K:] = False
        self.used = K
        self.compressions += 1
        self.seconds += time.perf_counter() - start
