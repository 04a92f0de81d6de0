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
QUERY_CHUNK = 256  # a dense mask is built for this many query rows at a time (``masked_attention``)


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
    """The key columns a chunk attends to, out of those of ``mask`` (bool [B, h, Q, K]): ``seen_columns`` of the
    columns some query row of each sequence (and mask head) sees; the others are masked for all of them and add
    nothing to any softmax."""
    return seen_columns(mask.any(2))


def seen_columns(seen: torch.Tensor) -> slice | torch.Tensor:
    """The key columns to attend to, given those the chunk's rows may see, bool [B, h, K] (a superset is exact too:
    the mask still masks what a row does not see).

    Their indices per sequence and mask head, int64 [B, h, n] (n: the most any of them sees; the seen columns
    first, in order, then unseen ones as padding, masked), when n is at most half of the prefix up to the last
    column any row sees: under an eviction record each (sequence, KV head) sees about budget + interval + the
    chunk's own keys, whichever ones it kept (G-KV at budget 512 over 4,096 tokens, chunks of 256 queries: 0.35
    of the causal kernel's key work), and S4R's forward (2T keys) sees the sinks and the projected keys. Else a
    slice up to that last column (under a causal record no row sees a key after the chunk's last query). Every
    column (a slice) when no row sees any. One host sync (on CUDA)."""
    seen_any = seen.flatten(0, 1).any(0)  # [K]
    last = torch.where(seen_any, torch.arange(seen_any.numel(), device=seen.device), -1).max()
    most, last = (int(x) for x in torch.stack([seen.sum(-1).max(), last]).cpu())
    if last < 0:
        return slice(None)
    if 2 * most > last + 1:
        return slice(0, last + 1)
    return torch.argsort((~seen).to(torch.uint8), dim=-1, stable=True)[..., :most]  # seen first, in order


def take_columns(key: torch.Tensor, value: torch.Tensor, columns: slice | torch.Tensor):
    """``key`` / ``value`` ([B, Hkv, K, D]) restricted to ``columns`` (``seen_columns``: a slice, or int64
    [B, h, n] per sequence and mask head; h = 1: the same for every KV head)."""
    if isinstance(columns, slice):
        return key[:, :, columns], value[:, :, columns]
    B, _, n = columns.shape
    per_head = columns.expand(B, key.shape[1], n)[..., None]  # [B, Hkv, n, 1]
    return key.gather(2, per_head.expand(-1, -1, -1, key.shape[-1])), value.gather(
        2, per_head.expand(-1, -1, -1, value.shape[-1])
    )


def mask_columns(mask: torch.Tensor, columns: slice | torch.Tensor) -> torch.Tensor:
    """``mask`` (bool [B, h, Q, K]) restricted to ``columns`` (as ``take_columns``)."""
    if isinstance(columns, slice):
        return mask[..., columns]
    B, h, n = columns.shape
    return mask.gather(3, columns[:, :, None, :].expand(B, h, mask.shape[2], n))


def masked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask_rows: Callable[..., torch.Tensor],
    scaling,
    dropout: float = 0.0,
    columns_of: Callable[[int, int], slice | torch.Tensor] | None = None,
):
    """``sdpa_with_head_mask`` under a dense mask built ``QUERY_CHUNK`` query rows at a time: ``mask_rows(start,
    end)`` gives bool [B, 1 or Hkv, end - start, K] for query rows start:end. A chunk that needs gradients is
    recomputed in the backward (mask included: ``torch.utils.checkpoint``), so a layer holds one chunk's mask,
    B x Hkv x QUERY_CHUNK x K entries (and SDPA's float copy of it), never B x Hkv x Q x K, also while its
    activations wait for the backward; that costs the masked attention's forward once more in the backward.
    Each query row's softmax is its own, so the chunks give what one call would. A chunk attends only to the
    keys its rows see (``seen_columns``): per sequence and KV head those it kept, gathered, when they are few
    (an eviction record, S4R's); else the keys up to the last one seen (under a causal record the keys after its
    last query are masked for all its rows, so the chunks together do about half the work of full-width rows,
    what the causal kernel skips).

    ``columns_of(start, end)``, when given, names those columns without the mask (``seen_columns`` of what the
    rows may see), and ``mask_rows(start, end, columns)`` builds the mask over them only: bool [B, 1 or Hkv,
    end - start, n]. Without it the columns come from the whole mask (``visible_columns``).

    query [B, H, Q, D]; key/value [B, Hkv, K, D]. Returns (out [B, Q, H, D], None).
    """
    Q = query.shape[2]

    def rows(start: int, end: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if columns_of is None:
            mask = mask_rows(start, end)
            columns = visible_columns(mask)
            mask = mask_columns(mask, columns)
        else:
            columns = columns_of(start, end)
            mask = mask_rows(start, end, columns)
        k, v = take_columns(k, v, columns)
        return sdpa_with_head_mask(q, k, v, mask, scaling, dropout)[0]

    if Q <= QUERY_CHUNK:  # one chunk: nothing to recompute it for
        return rows(0, Q, query, key, value), None
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


def decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The transformer body (hidden states out) and the LM head of a causal LM, through PEFT wrappers."""
    base = base_model(model)
    return base.get_decoder(), base.get_output_embeddings()


# configuration keys with which a causal LM changes its logits after the LM head, and the value that changes
# nothing: Gemma 2/3's softcapping, Cohere's scale, Granite's (and MiniCPM3's, HyperCLOVA X's) scaling, ...
LOGIT_PROCESSING = {
    "final_logit_softcapping": None,
    "logit_scale": 1.0,
    "logits_scaling": 1.0,
    "output_multiplier": 1.0,
}


def check_plain_head(config, name: str = "the model") -> None:
    """ValueError when the causal LM of ``config`` (or of its ``text_config``) changes its logits after the LM head
    (``LOGIT_PROCESSING``): the trainer's log-probs, a rollout's given tokens and lm-eval's scores come from the
    bare head (``decoder_and_head``), so they would not be the logits the model samples from."""
    for part in (config, getattr(config, "text_config", None)):
        for key, plain in LOGIT_PROCESSING.items():
            value = getattr(part, key, None)
            if value is not None and value != plain:
                raise ValueError(
                    f"{name} changes its logits after the LM head ({key}={value} in its configuration), which this "
                    "project's log-probs do not apply (they come from the bare head): models that softcap or "
                    "scale their logits are not supported"
                )


def head_dim(config) -> int:
    """Per-head dimension of an HF config (``head_dim`` when set, else hidden size / heads)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def register() -> str:
    """Register the attention function and its mask function; returns the name to give ``attn_implementation``."""
    AttentionInterface.register(ATTENTION_NAME, kv_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    return ATTENTION_NAME


def use_kv_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Switch a loaded model to the registered attention (idempotent); returns the model. ValueError for a model
    whose logits are not its LM head's (``check_plain_head``)."""
    check_plain_head(model.config, type(base_model(model)).__name__)
    name = register()
    if model.config._attn_implementation != name:
        model.set_attn_implementation(name)
    return model


register()
