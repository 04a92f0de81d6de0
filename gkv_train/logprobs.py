"""Log-probabilities of completion tokens under the eviction record's masks, with a chunked LM head."""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from gkv_train.attention import use_kv_attention
from gkv_train.masks import attention_context
from gkv_train.record import logical_positions


def _chunk_logprobs(hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, temperature: float):
    """hidden [N, d], targets int64 [N] -> log p(target) [N] under softmax(logits / temperature), in fp32."""
    logits = head(hidden).float() / temperature
    return logits.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)


def decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The transformer body (hidden states out) and the LM head of a causal LM, through PEFT wrappers."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder(), base.get_output_embeddings()


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    num_tokens: int,
    record=None,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    backend: str = "auto",
) -> torch.Tensor:
    """Log-probs of the last ``num_tokens`` columns of each row, each given everything before it.

    input_ids, attention_mask: [B, T] (prompt left-padded, completion right-padded, as the rollout returns);
    record: the rollout's record (``evict_at`` int32 [B, L, Hkv, T_rec] or an ``S4RRecord``), or None for full
        causal attention;
    temperature: the sampling temperature (log-probs are those of softmax(logits / temperature)).
    Returns float32 [B, num_tokens]. The LM head runs over ``chunk_tokens`` rows at a time (re-computed in the
    backward pass), so the [B, num_tokens, vocab] logits are never held at once.
    """
    use_kv_attention(model)
    decoder, head = decoder_and_head(model)
    context = attention_context(model, record, attention_mask, backend)
    positions = logical_positions(attention_mask)  # the rollout's RoPE positions: padding shifts nothing
    hidden = decoder(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, kv_context=context, use_cache=False
    )
    hidden = hidden.last_hidden_state[:, -num_tokens - 1 : -1]
    B, N, d = hidden.shape
    flat, targets = hidden.reshape(B * N, d), input_ids[:, -num_tokens:].reshape(B * N)
    return head_logprobs(flat, head, targets, temperature, chunk_tokens).view(B, N)


def head_logprobs(hidden: torch.Tensor, head, targets: torch.Tensor, temperature: float, chunk_tokens: int = 1024):
    """log p(target) [N] from final hidden states [N, d] through the LM head, ``chunk_tokens`` rows at a time
    (each chunk re-computed in the backward pass when gradients flow)."""
    out = []
    for start in range(0, hidden.shape[0], chunk_tokens):
        args = (hidden[start : start + chunk_tokens], head, targets[start : start + chunk_tokens], temperature)
        if torch.is_grad_enabled() and hidden.requires_grad:
            out.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False))
        else:
            out.append(_chunk_logprobs(*args))
    return torch.cat(out)
