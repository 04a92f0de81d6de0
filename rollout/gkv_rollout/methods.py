"""The eviction methods of the G-KV family: one small class each, implementing only its score.

A compression (``gkv_rollout.eviction_cache.EvictionCache.compress``) builds a ``LayerState`` per layer, asks the method
for a score per cached token, and keeps the sinks, the window and the best-scored candidates within the
budget (``gkv_rollout.scoring.select_keep``, shared by every method). Defaults reproduce the reference
implementation (microsoft/G-KV at 6db3b2e: ``ScoreBasedKV`` / ``StreamingLLMKV`` with the recipes of its
``scripts/inference.sh``); options that depart from it are listed in docs/methods.md with their reasons.

Adding a method: subclass ``EvictionMethod`` (or a close relative), give it a ``name``, the ``defaults`` it
changes (``interval`` among them) and the ``options`` of ``EvictionOptions`` its score reads (as
``self.config.eviction.alpha``, ...), implement ``score``, and decorate it with ``@register``;
``CompressionConfig(method=name)``, the recipes, every script and the registry-driven tests then accept it. From
the user's own code without touching this package: ``compression.method=package.module:Class`` (the module is
imported and the class registered under that name).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from gkv_rollout.scoring import (
    hashed_uniform,
    key_redundancy,
    merge_history,
    normalize_max,
    pool_scores,
    window_attention,
)

if TYPE_CHECKING:
    from gkv_rollout.config import CompressionConfig


@dataclass(frozen=True)
class LayerState:
    """One layer's cache at a compression: what a method may score it with.

    query [B, Hkv, G, W, D]: the last W queries (after RoPE); query_pos int64 [B, W]; query_ok bool [B, W];
    keys [B, Hkv, S, D] (after RoPE); key_pos int64 [B, Hkv, S] logical positions; key_ok bool [B, S];
    candidates bool [B, Hkv, S]: occupied slots outside the window and sinks (the only ones a score decides);
    history float32 [B, Hkv, S]: each token's global score from the last compression, NaN where it has none;
    scale: the attention scale (1 / sqrt(D)); layer: the layer's index; rows int64 [B]: each sequence's row in the
    rollout (the batch it started with); lengths int64 [B]: tokens each sequence has seen (the compression's time).
    """

    query: torch.Tensor
    query_pos: torch.Tensor
    query_ok: torch.Tensor
    keys: torch.Tensor
    key_pos: torch.Tensor
    key_ok: torch.Tensor
    candidates: torch.Tensor
    history: torch.Tensor
    scale: float
    layer: int = 0
    rows: torch.Tensor | None = None
    lengths: torch.Tensor | None = None


class EvictionMethod:
    """Base of the G-KV family. ``defaults`` are the values that ``CompressionConfig`` options left at None
    take for this method (by their flat names: ``window``, ``interval``, ``alpha``, ...); subclasses override only
    what differs. ``options``: the ``EvictionOptions`` its score reads (``compression.eviction.*``); setting
    another is refused."""

    name: ClassVar[str]
    options: ClassVar[tuple[str, ...]] = ()
    defaults: ClassVar[dict] = dict(
        window=16,
        interval=128,
        sinks=0,
        pool_kernel=1,
        group_agg="max",
        alpha=0.8,
        lambda_=0.5,
        form="max",
        redundancy=False,
        similarity="rkv",
    )

    def __init__(self, config: CompressionConfig, seed: int = 0):
        self.config = config  # resolved: no option is None
        self.seed = seed  # the rollout's sampling seed (for methods that draw at random)

    def score(self, state: LayerState) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(score float32 [B, Hkv, S], new history [B, Hkv, S] or None); higher scores are kept first.
        Only the candidate slots' scores matter."""
        raise NotImplementedError

    def attention(self, state: LayerState) -> torch.Tensor:
        """The window's mean attention to every slot [B, Hkv, S] (GQA heads combined per query)."""
        return window_attention(
            state.query,
            state.query_pos,
            state.query_ok,
            state.keys,
            state.key_pos,
            state.key_ok,
            state.scale,
            self.config.group_agg,
        )

    def pool(self, scores: torch.Tensor, state: LayerState) -> torch.Tensor:
        return pool_scores(scores, state.candidates, self.config.pool_kernel, self.config.pool)

    def redundancy(self, state: LayerState) -> torch.Tensor:
        return key_redundancy(state.keys, state.key_ok, self.config.eviction.similarity)


METHODS: dict[str, type[EvictionMethod]] = {}


def register(cls: type[EvictionMethod]) -> type[EvictionMethod]:
    """Make ``cls`` available as ``CompressionConfig(method=cls.name)``."""
    METHODS[cls.name] = cls
    return cls


def method_class(name: str) -> type[EvictionMethod]:
    """The registered method ``name``; ``package.module:Class`` imports the module and registers the class under
    that name (so the configuration, the record and every process of a run name it the same way)."""
    if name not in METHODS and ":" in name:
        module, _, attribute = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as error:
            raise ValueError(
                f"compression method {name!r}: cannot import {attribute} from {module} ({error})"
            ) from None
        if not (isinstance(cls, type) and issubclass(cls, EvictionMethod)):
            raise ValueError(f"compression method {name!r} is not an EvictionMethod subclass")
        if cls.score is EvictionMethod.score:
            raise ValueError(
                f"compression method {name!r} does not implement score(state): an EvictionMethod "
                "subclass gives each cached token its score"
            )
        METHODS[name] = cls
    if name not in METHODS:
        known = ", ".join(("full", *METHODS, "s4r"))
        raise ValueError(f"unknown compression method {name!r}; choose one of {known}, or package.module:Class")
    return METHODS[name]


@register
class StreamingLLM(EvictionMethod):
    """StreamingLLM: the ``sinks`` first tokens and the most recent ones."""

    name = "streaming"
    defaults = {**EvictionMethod.defaults, "sinks": 4}

    def score(self, state):
        return state.key_pos.float(), None


@register
class SnapKV(EvictionMethod):
    """SnapKV: the window's attention, max-pooled along the sequence (kernel 5)."""

    name = "snapkv"
    defaults = {**EvictionMethod.defaults, "pool_kernel": 5}

    def score(self, state):
        return self.pool(self.attention(state), state), None


@register
class RKV(SnapKV):
    """R-KV: ``lambda * pooled attention - (1 - lambda) * key redundancy``, both unnormalised (lambda 0.1)."""

    name = "rkv"
    defaults = {**SnapKV.defaults, "lambda_": 0.1, "redundancy": True}
    options = ("lambda_", "redundancy", "similarity")

    def score(self, state):
        attention, _ = super().score(state)
        lam = self.config.eviction.lambda_
        return lam * attention - (1.0 - lam) * self.redundancy(state), None


@register
class GKV(EvictionMethod):
    """G-KV: the window's attention normalised by its maximum, blended with each token's score history
    (``form`` max: ``max(alpha*old, new)``; mean; sum), pooled when ``pool_kernel`` > 1, minus the key
    redundancy normalised by its maximum: ``lambda * score - (1 - lambda) * redundancy``. The history kept for
    the next compression is the blended score before pooling, for the kept candidates only."""

    name = "gkv"
    defaults = {**EvictionMethod.defaults, "redundancy": True}
    options = ("alpha", "lambda_", "form", "redundancy", "similarity")

    def score(self, state):
        cfg = self.config.eviction
        new = normalize_max(self.attention(state), state.candidates)
        history = merge_history(state.history, new, cfg.form, cfg.alpha)
        score = self.pool(history, state)
        if cfg.redundancy:
            redundancy = normalize_max(self.redundancy(state), state.candidates)
            score = cfg.lambda_ * score - (1.0 - cfg.lambda_) * redundancy
        return score, history


@register
class H2O(GKV):
    """H2O as the reference runs it: the attention of the newest query (window 1), normalised by its maximum at
    each compression and accumulated, ``alpha * old + new``; no redundancy."""

    name = "h2o"
    defaults = {**GKV.defaults, "window": 1, "form": "sum", "redundancy": False}


@register
class Random(EvictionMethod):
    """Random eviction, per layer and KV head (the control every scorer must beat; reported to match the best
    scorers on reasoning benchmarks, arXiv 2609.03430): at each compression every candidate gets a fresh uniform
    score, a pure function of the rollout's seed, the sequence's row, the layer, the KV head, the token's position
    and the compression's time (``hashed_uniform``), so a rollout is reproducible and independent of padding.
    Sinks and the window are kept as for every method."""

    name = "random"

    def score(self, state):
        B, Hkv, _ = state.key_pos.shape
        rows = (torch.arange(B, device=state.key_pos.device) if state.rows is None else state.rows)[:, None, None]
        time = (state.key_pos.new_zeros(B) if state.lengths is None else state.lengths)[:, None, None]
        heads = torch.arange(Hkv, device=state.key_pos.device)[None, :, None]
        return hashed_uniform(self.seed, rows, time, state.layer * Hkv + heads, state.key_pos), None


@register
class TOVA(EvictionMethod):
    """TOVA (Oren et al., 2024, "Transformers are Multi-State RNNs"): at every step (interval 1) the cache over
    budget drops the tokens the newest query attends to least; per layer and KV head here (GQA heads combined by
    max), like every method of this family, where the paper averages a layer's heads; no pooling, no history."""

    name = "tova"
    defaults = {**EvictionMethod.defaults, "window": 1, "interval": 1}

    def score(self, state):
        return self.attention(state), None
