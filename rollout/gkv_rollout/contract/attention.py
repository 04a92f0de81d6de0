"""One registered attention function for compressed-cache rollouts and masked training.

``kv_attention`` is registered with transformers' ``AttentionInterface`` (and, with ``sdpa_mask``, with its
``AttentionMaskInterface``) under ``ATTENTION_NAME``. A model set to it behaves exactly like ``sdpa`` unless a
forward call passes ``kv_context=...``: an object with an ``attend(module, query, key, value, attention_mask,
scaling, dropout)`` method, which then owns the attention of every layer (it reads ``module.layer_idx``). The
rollout caches and the records' attention contexts (masks) are such contexts. No modeling file is forked and no
library global is patched.
"""

from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION_NAME = "kv_compress"
QUERY_CHUNK = 512  # a dense mask is built for this many query rows at a time (``masked_attention``)


@runtime_checkable
class AttentionContext(Protocol):
    """What owns every layer's attention during a forward passed ``kv_context=...``. Four implement it: the
    rollout caches (``EvictionCache``, ``S4RCache``: attend over the compressed cache) and the records' masks
    (``EvictionMasks``, ``S4RMasks``: reproduce, in a training forward, what each token saw)."""

    def attend(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0):
        """``module.layer_idx``'s attention: query [B, H, Q, D], key/value [B, Hkv, K, D] (after RoPE) ->
        (out [B, Q, H, D], None)."""


def kv_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    scaling=None,
    dropout=0.0,
    kv_context: AttentionContext | None = None,
    **kwargs,
):
    """query [B, H, Q, D], key/value [B, Hkv, K, D] (after RoPE) -> (out [B, Q, H, D], None)."""
    if kv_context is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError("compressed-cache attention does not support sliding-window layers")
    return kv_context.attend(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout)


def sdpa_with_head_mask(query, key, value, mask, scaling, dropout=0.0):
    """Grouped-query SDPA under a boolean mask that may differ per KV head.

    query [B, H, Q, D]; key/value [B, Hkv, K, D]; mask bool [B, 1 or Hkv, Q, K].
    Returns (out [B, Q, H, D], None), as attention functions return.
    """
    B, H, Q, D = query.shape
    Hkv, K = key.shape[1], key.shape[2]
    groups = H // Hkv
    if mask.shape[1] > 1:
        # Fold the KV heads into the batch: each (sequence, KV head) attends with its G query heads to its one key
        # head (expanded, not copied) under its own mask, which broadcasts over the G heads. Repeating the mask to
        # H heads instead costs a copy and SDPA's conversion of a G times larger mask.
        out = F.scaled_dot_product_attention(
            query.reshape(B * Hkv, groups, Q, D),
            key.reshape(B * Hkv, 1, K, D).expand(-1, groups, -1, -1),
            value.reshape(B * Hkv, 1, K, value.shape[-1]).expand(-1, groups, -1, -1),
            attn_mask=mask.reshape(B * Hkv, 1, Q, K),
            dropout_p=dropout,
            scale=scaling,
        ).reshape(B, H, Q, -1)  # a kernel may return another layout (CUDA's memory-efficient one does)
    else:
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling, enable_gqa=groups > 1
        )
    return out.transpose(1, 2).contiguous(), None


def visible_columns(mask: torch.Tensor) -> slice | torch.Tensor:
    """The key columns a chunk attends to, out of those of ``mask`` (bool [B, h, Q, K]): the columns no query row
    sees are masked for every row and add nothing to any softmax. A slice up to the last column some row sees
    (under a causal record no row sees a key after the chunk's last query); their indices, int64 [n], when they
    are at most half of that prefix (S4R's record: the sinks among the exact keys, then the projected ones; an
    eviction record whose budget is small against the length), where the columns saved pay for gathering the
    mask, keys and values. Every column (a slice) when no row sees any. One host sync on CUDA."""
    seen = mask.reshape(-1, mask.shape[-1]).any(0).cpu()  # [K]
    columns = seen.nonzero().squeeze(1)
    if not columns.numel():
        return slice(None)
    prefix = int(columns[-1]) + 1
    return columns.to(mask.device) if 2 * columns.numel() <= prefix else slice(0, prefix)


def masked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask_rows: Callable[[int, int], torch.Tensor],
    scaling,
    dropout: float = 0.0,
):
    """``sdpa_with_head_mask`` under a dense mask built ``QUERY_CHUNK`` query rows at a time: ``mask_rows(start,
    end)`` gives bool [B, 1 or Hkv, end - start, K] for query rows start:end. A chunk that needs gradients is
    recomputed in the backward (mask included: ``torch.utils.checkpoint``), so a layer holds one chunk's mask,
    B x Hkv x QUERY_CHUNK x K entries (and SDPA's float copy of it), never B x Hkv x Q x K, also while its
    activations wait for the backward; that costs the masked attention's forward once more in the backward.
    Each query row's softmax is its own, so the chunks give what one call would. A chunk attends only to the
    keys some of its rows see (``visible_columns``): under a causal record the keys after its last query are
    masked for all its rows, so the chunks together do about half the work of full-width rows (what the causal
    kernel skips).

    query [B, H, Q, D]; key/value [B, Hkv, K, D]. Returns (out [B, Q, H, D], None).
    """
    Q = query.shape[2]
    if Q <= QUERY_CHUNK:
        return sdpa_with_head_mask(query, key, value, mask_rows(0, Q), scaling, dropout)

    def rows(start: int, end: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        mask = mask_rows(start, end)
        keys = visible_columns(mask)
        return sdpa_with_head_mask(q, k[:, :, keys], v[:, :, keys], mask[..., keys], scaling, dropout)[0]

    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    out = []
    for start in range(0, Q, QUERY_CHUNK):
        end = min(start + QUERY_CHUNK, Q)
        q = query[:, :, start:end]
        out.append(
            checkpoint(rows, start, end, q, key, value, use_reentrant=False)
            if grad
            else rows(start, end, q, key, value)
        )
    return torch.cat(out, dim=1), None


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a PEFT wrapper (the model itself when unwrapped)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def head_dim(config) -> int:
    """Per-head dimension of an HF config (``head_dim`` when set, else hidden size / heads)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def register() -> str:
    """Register the attention function and its mask function; returns the name to give ``attn_implementation``."""
    AttentionInterface.register(ATTENTION_NAME, kv_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    return ATTENTION_NAME


def use_kv_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Switch a loaded model to the registered attention (idempotent); returns the model."""
    name = register()
    if model.config._attn_implementation != name:
        model.set_attn_implementation(name)
    return model


register()
