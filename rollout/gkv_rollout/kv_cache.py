"""The protocol of a rollout's KV cache, which the engine drives forward by forward."""

from __future__ import annotations

from typing import Protocol

import torch


class KVCache(Protocol):
    """The attention context (``gkv_rollout.contract.attention``) holding one batched rollout's KV cache.

    The engine calls, per forward: ``begin`` (reserve the new tokens, get the forward's mask), the model
    (every layer calls ``attend``), ``end``; then ``after_prefill`` once or ``after_step`` after each decode
    forward (where compression happens); ``select_rows`` when finished sequences leave the batch; ``finish`` and
    ``memory_share`` at the end. A decode forward takes one token per sequence, or several given ones (a prefix,
    a replayed completion) as far as ``forward_span`` allows.
    """

    static_decode: bool = False  # whether ``begin`` takes static=True (``SamplingConfig.compile_decode``)
    compressions: int  # compressions run so far
    seconds: float  # time spent compressing (or, for S4R, building bases, scoring, reconstructing and attending)
    phase_seconds: dict[str, float]  # ``seconds`` by phase (they sum to it)

    def begin(self, positions: torch.Tensor, valid: torch.Tensor, static: bool = False) -> torch.Tensor:
        """positions int64 [B, Q] logical positions of the new tokens, valid bool [B, Q] -> bool mask
        [B, 1, Q, K] for the forward. static (only when ``static_decode``): a one-token decode step whose
        attention shapes and write slot do not depend on Python state, for a compiled step."""

    def attend(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0):
        """One layer's attention over the cache and the new keys/values: (out [B, Q, H, D], None)."""

    def step_buffers(self) -> list[torch.Tensor]:
        """(Only when ``static_decode``) the tensors a static step writes in place; on CUDA the engine marks
        their addresses static, so that the step runs as a CUDA graph."""
        raise NotImplementedError

    def end(self) -> None:
        """Commit the tokens of the forward that just ran."""

    def after_prefill(self) -> None:
        """Called once after the prompt's forward (a compression point); nothing by default."""

    def after_step(self, generated: int) -> None:
        """Called after a decode forward, once ``generated`` generated tokens have been through the model (a
        compression point); nothing by default."""

    def forward_span(self, generated: int) -> int:
        """How many tokens per sequence the next decode forward may take once ``generated`` generated tokens have
        been through the model: as many as reach the next point where ``after_step`` may change the cache, so that
        one forward of that many (causal among them) leaves the cache as that many one-token forwards do. 1 by
        default: a cache that acts after every token."""
        return 1

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep only the sequences at indices keep int64 [B'] (of the rows held now, in this order): the engine
        drops finished sequences. What ``finish`` returns still covers every sequence of the batch. A cache
        that does not implement it (raises NotImplementedError) has every sequence decoded to the end."""
        raise NotImplementedError

    def finish(self, prompt_lengths: torch.Tensor, completion_lengths: torch.Tensor, width: int):
        """(record or None, retention float32 [N]) of the rollout, record positions < ``width``."""

    def memory_share(self, prompt_lengths: torch.Tensor, completion_lengths: torch.Tensor, retention: torch.Tensor):
        """float32 [N]: what the cache stores of each sequence at its end, as a share of the full KV cache of its
        tokens. A cache that stores exactly the keys and values it attends to: the retention (``finish``'s)."""
        return retention

    def nbytes(self) -> int:
        """Bytes of the cache's tensors."""
