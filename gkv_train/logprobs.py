"""Log-probabilities of completion tokens under a rollout record, and divergences, with a chunked LM head."""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.utils.checkpoint import checkpoint

from gkv_rollout.contract import attention_context
from gkv_rollout.contract.attention import decoder_and_head, use_kv_attention
from gkv_rollout.contract.record import logical_positions
from gkv_rollout.sampling import head_logprobs


@contextmanager
def logical_forward(model: torch.nn.Module, context=None):
    """Inside the block, every forward of ``model`` given a 2-D padding mask runs at the logical positions of
    that mask (as the rollout did: padding shifts no RoPE position) and, with an attention ``context``, attends
    through it (``gkv_rollout.contract.attention``). For callers that do not build the forward's arguments
    themselves (TRL's log-prob helpers)."""

    def add_positions_and_context(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        if mask is None or mask.dim() != 2 or "kv_context" in kwargs:
            return None
        kwargs["position_ids"] = logical_positions(mask)
        if context is not None:
            kwargs["kv_context"] = context
        return args, kwargs

    handle = use_kv_attention(model).register_forward_pre_hook(add_positions_and_context, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def hidden_states(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, record=None, backend: str = "auto"
) -> torch.Tensor:
    """Final hidden states [B, T, d] of a padded batch (input_ids, attention_mask [B, T]) at the rollout's
    logical positions (padding shifts no RoPE position), attending under ``record`` (None: plain causal)."""
    use_kv_attention(model)
    decoder, _ = decoder_and_head(model)
    context = attention_context(record, model, attention_mask, backend)
    positions = logical_positions(attention_mask)
    return decoder(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, kv_context=context, use_cache=False
    ).last_hidden_state


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
    record: the rollout's record (``gkv_rollout.contract.record.Record``), or None for full causal attention;
    temperature: the sampling temperature (log-probs are those of softmax(logits / temperature)).
    Returns float32 [B, num_tokens]. The LM head runs over ``chunk_tokens`` rows at a time (re-computed in the
    backward pass), so the [B, num_tokens, vocab] logits are never held at once.
    """
    _, head = decoder_and_head(model)
    hidden = hidden_states(model, input_ids, attention_mask, record, backend)[:, -num_tokens - 1 : -1]
    B, N, d = hidden.shape
    flat, targets = hidden.reshape(B * N, d), input_ids[:, -num_tokens:].reshape(B * N)
    return head_logprobs(flat, head, targets, temperature, chunk_tokens).view(B, N)


def token_divergence(student_logits, teacher_logits, targets, divergence: str, temperature: float) -> torch.Tensor:
    """Per-token loss [N] from student and teacher logits [N, V] and the trace tokens targets [N]."""
    if divergence == "sft":
        return -student_logits.float().log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    log_q = (student_logits.float() / temperature).log_softmax(-1)
    log_p = (teacher_logits.float() / temperature).log_softmax(-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1) * temperature**2


def _chunk_loss(student_hidden, teacher_hidden, student_head, teacher_head, targets, divergence, temperature):
    teacher_logits = None if teacher_hidden is None else teacher_head(teacher_hidden)
    return token_divergence(student_head(student_hidden), teacher_logits, targets, divergence, temperature).sum()


def chunked_divergence(
    student_hidden, teacher_hidden, student_head, teacher_head, targets, divergence, temperature, chunk_tokens
) -> torch.Tensor:
    """Sum of ``token_divergence`` over N tokens, ``chunk_tokens`` at a time.

    student_hidden [N, d] (with grad), teacher_hidden [N, d] or None for ``sft``, targets int64 [N].
    """
    total = student_hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, student_hidden.shape[0], chunk_tokens):
        rows = slice(start, start + chunk_tokens)
        teacher = None if teacher_hidden is None else teacher_hidden[rows]
        args = (student_hidden[rows], teacher, student_head, teacher_head, targets[rows], divergence, temperature)
        if torch.is_grad_enabled() and student_hidden.requires_grad:
            total = total + checkpoint(_chunk_loss, *args, use_reentrant=False)
        else:
            total = total + _chunk_loss(*args)
    return total


def divergence_under_record(
    model,
    teacher,
    rollout,
    divergence: str,
    temperature: float,
    chunk_tokens: int,
    backend: str = "auto",
    base=None,
    trained=None,
):
    """KL-type divergence of ``model`` attending under the rollout's record from ``teacher`` with full
    attention, over the rollout's completion tokens: distillation's loss and the evaluation's compressed KL.

    rollout: a ``RolloutOutput`` (sequences, attention_mask [B, T], record, completion_mask [B, C]); divergence:
    ``forward_kl`` | ``reverse_kl`` ... as ``token_divergence`` (``sft``: the teacher is not run); ``model`` may be
    a training wrapper (DDP, DeepSpeed: its forward keeps their gradient hooks), ``base`` the model it wraps;
    ``trained``: bool [B, C], the completion tokens the divergence covers (None: every real one; a given beginning
    is left out). Returns (sum over the N covered tokens of the per-token divergence, float32 scalar; the student's
    final hidden states [N, d]; targets int64 [N]; the student's LM head)."""
    base = base if base is not None else model
    use_kv_attention(base)
    ids, mask = rollout.sequences, rollout.attention_mask
    positions = logical_positions(mask)
    context = attention_context(rollout.record, base, mask, backend)
    hidden = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        kv_context=context,
        use_cache=False,
        logits_to_keep=1,
        output_hidden_states=True,
    ).hidden_states[-1]
    C = rollout.num_completion_tokens
    real = rollout.completion_mask.bool() if trained is None else trained
    student_hidden, targets = hidden[:, -C - 1 : -1][real], ids[:, -C:][real]
    _, head = decoder_and_head(base)
    teacher_hidden, teacher_head = None, None
    if divergence != "sft":
        teacher_decoder, teacher_head = decoder_and_head(teacher)
        with torch.no_grad():
            teacher_hidden = teacher_decoder(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False
            ).last_hidden_state[:, -C - 1 : -1][real]
    total = chunked_divergence(
        student_hidden, teacher_hidden, head, teacher_head, targets, divergence, temperature, chunk_tokens
    )
    return total, student_hidden, targets, head
