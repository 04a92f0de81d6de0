"""Compression methods: one small class each, registered by name, declaring its own options.

A method class (``Method``) names itself, says in one line what it does (``summary``: the methods tables of the
README and docs are generated from it), declares its options as a dataclass with real defaults and help
(``Options``: ``compression.options.*``), gives the shared options its values (``defaults``: window, interval, sinks,
pool_kernel, group_agg) and builds its cache (``make_cache``); the checks a job runs before any work ask it
(``check_generation``, ``check_model``, ``check_prompts``, ``cache_bytes``).

The eviction family (``EvictionMethod``): a compression (``gkv_rollout.eviction_cache.EvictionCache.compress``) builds a
``LayerState`` per layer, asks the method for a score per cached token, and keeps the sinks, the window and the
best-scored candidates within the budget (``gkv_rollout.scoring.select_keep``, shared by every method). Defaults
reproduce the reference implementation (microsoft/G-KV at 6db3b2e: ``ScoreBasedKV`` / ``StreamingLLMKV`` with the
recipes of its ``scripts/inference.sh``); options that depart from it are listed in docs/methods.md with their
reasons. S4R (``gkv_rollout.s4r_cache.S4R``) is a method of its own kind: its own cache and record.

Adding a method: subclass ``EvictionMethod`` (or a close relative), give it a ``name``, a ``summary``, the
``defaults`` it changes (``interval`` among them) and its ``Options`` (read as ``self.options.alpha``, ...), implement
``score``, and decorate it with ``@register``; ``CompressionConfig(method=name)``, the recipes, every script, the
docs' tables and the registry-driven tests then take it. From the user's own code without touching this package:
``compression.method=package.module:Class`` (the module is imported, its code run, and the class registered under
that name).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
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
    from gkv_rollout.config import Settings
    from gkv_rollout.kv_cache import KVCache

GKV_FORMS = ("max", "mean", "sum")
SIMILARITIES = ("rkv", "mean_cosine")
POOLINGS = ("max", "avg")
GROUP_AGGREGATIONS = ("max", "mean")
# Modules of this package that register methods of their own kind (imported on the registry's first use)
BUILT_IN_MODULES = ("gkv_rollout.s4r_cache",)


@dataclass(frozen=True)
class ModelShape:
    """What a model's configuration says about its cache: context (max_position_embeddings; None when it gives
    none), layers, query and KV heads, head dim; ``name`` for messages."""

    name: str
    context: int | None
    layers: int
    heads: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, name: str, config) -> ModelShape:
        config = getattr(config, "text_config", None) or config
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        context = getattr(config, "max_position_embeddings", None)
        return cls(name, context, config.num_hidden_layers, heads, kv_heads, head_dim)

    @property
    def latent_dim(self) -> int:
        """D' = KV heads x head dim: the width of all KV heads side by side."""
        return self.kv_heads * self.head_dim

    def token_bytes(self, dtype_bytes: int) -> int:
        """Bytes of one token's keys and values in every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


@dataclass
class NoOptions:
    """A method without options of its own."""


def check_unit(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value}")


def check_choice(what: str, value, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")


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


METHODS: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    """Make ``cls`` available as ``CompressionConfig(method=cls.name)``."""
    METHODS[cls.name] = cls
    return cls


class Method:
    """A compression method: ``name`` (``compression.method``), a one-line ``summary``, its ``Options`` (a dataclass
    of its own options with their defaults and help: ``compression.options.*``), the values it gives the shared
    options left unset (``defaults``), and the cache it runs with (``make_cache``). The checks before a job's work
    ask it (each does nothing unless a method needs it)."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    compresses: ClassVar[bool] = True
    static_decode: ClassVar[bool] = True  # its cache has a static decode step (sampling.compile_decode)
    rounds: ClassVar[bool] = False  # it compresses in rounds, every ``interval`` generated tokens
    defaults: ClassVar[dict] = dict(window=16, interval=128, sinks=0, pool_kernel=1, group_agg="max")

    @classmethod
    def validate(cls, settings: Settings) -> None:
        """ValueError naming what is wrong with the shared options of ``settings`` for this method."""
        if settings.window <= 0:
            raise ValueError(f"window must be positive, got {settings.window}")
        if settings.sinks < 0:
            raise ValueError(f"sinks must be >= 0, got {settings.sinks}")
        check_choice("pooling", settings.pool, POOLINGS)
        if settings.pool_kernel < 1 or settings.pool_kernel % 2 == 0:
            raise ValueError(f"pool_kernel must be a positive odd number, got {settings.pool_kernel}")
        check_choice("group aggregation", settings.group_agg, GROUP_AGGREGATIONS)

    @classmethod
    def make_cache(
        cls, model, settings: Settings, batch: int, prompt_width: int, max_new: int, device, seed: int = 0
    ) -> KVCache:
        """The KV cache of one batched rollout of ``batch`` sequences (prompts padded to ``prompt_width``, at most
        ``max_new`` new tokens; ``seed``: the rollout's sampling seed)."""
        raise NotImplementedError

    @classmethod
    def cache_bytes(
        cls, settings: Settings, shape: ModelShape, rows: int, prompt: int, new: int, dtype_bytes: int
    ) -> int:
        """Estimated bytes of one rollout's cache and record: ``rows`` sequences of ``prompt`` (the padded width) +
        ``new`` tokens, cache entries of ``dtype_bytes``."""
        raise NotImplementedError

    @classmethod
    def check_generation(cls, settings: Settings, max_new_tokens: int, key: str) -> None:
        """ValueError when an option makes no sense within a generation of ``max_new_tokens`` (the setting
        ``key``)."""

    @classmethod
    def check_model(cls, settings: Settings, shape: ModelShape) -> None:
        """ValueError when an option exceeds what the model ``shape`` allows."""

    @classmethod
    def check_prompts(cls, settings: Settings, shortest: int, which: str) -> None:
        """ValueError when the shortest prompt (``shortest`` tokens, ``which``: the problem and the rollout, for the
        message) is too short for this method."""

    @classmethod
    def check_lengths(cls, settings: Settings, shape: ModelShape, shortest: int, new: int) -> None:
        """ValueError when an option cannot hold for ``shape`` with a prompt of ``shortest`` tokens and ``new``
        generated ones (S4R's eta below its smallest state)."""


@register
class Full(Method):
    """No compression: every token's keys and values, always."""

    name = "full"
    summary = "no compression"
    compresses = False

    @classmethod
    def validate(cls, settings: Settings) -> None:
        """Full reads no option (a sweep's template may hold its runs' options)."""

    @classmethod
    def make_cache(cls, model, settings, batch, prompt_width, max_new, device, seed=0):
        from gkv_rollout.eviction_cache import EvictionCache

        dtype = next(model.parameters()).dtype
        total = prompt_width + max_new
        return EvictionCache(model.config, settings, batch, total, total, dtype, device, seed)

    @classmethod
    def cache_bytes(cls, settings, shape, rows, prompt, new, dtype_bytes):
        return rows * ((prompt + new) * shape.token_bytes(dtype_bytes) + new * 12)


class EvictionMethod(Method):
    """Base of the G-KV family: every ``interval`` generated tokens (and after the prefill when a prompt exceeds the
    budget) keep, per layer and KV head, the sinks, the last ``window`` tokens and the best-scored others within
    ``budget``; a method implements ``score``. Its ``options`` are an instance of its ``Options``."""

    rounds = True

    def __init__(self, settings: Settings, seed: int = 0):
        self.config = settings
        self.options = settings.options
        self.seed = seed  # the rollout's sampling seed (for methods that draw at random)

    @classmethod
    def validate(cls, settings: Settings) -> None:
        super().validate(settings)
        if settings.budget <= settings.window:
            raise ValueError(
                f"budget ({settings.budget}) must be larger than window ({settings.window}): the budget counts the "
                "window"
            )
        if settings.sinks + settings.window > settings.budget:
            raise ValueError(
                f"sinks ({settings.sinks}) + window ({settings.window}) must fit in the budget ({settings.budget})"
            )
        if settings.interval <= 0:
            raise ValueError(f"interval must be a positive number of tokens, got {settings.interval}")

    @classmethod
    def make_cache(cls, model, settings, batch, prompt_width, max_new, device, seed=0):
        """An ``EvictionCache`` sized to the most it ever holds: budget + interval tokens after the first
        compression."""
        from gkv_rollout.eviction_cache import EvictionCache

        dtype = next(model.parameters()).dtype
        total = prompt_width + max_new
        capacity = min(total, max(prompt_width, settings.budget) + settings.interval)
        return EvictionCache(model.config, settings, batch, capacity, total, dtype, device, seed)

    @classmethod
    def cache_bytes(cls, settings, shape, rows, prompt, new, dtype_bytes):
        """At most max(prompt, budget) + interval slots of keys and values, plus the int32 record of every position
        per layer and KV head and the slots' positions and scores, and the sampled tokens and their log-probs."""
        total = prompt + new
        slots = min(total, max(prompt, settings.budget) + settings.interval)
        size = slots * shape.token_bytes(dtype_bytes) + shape.layers * shape.kv_heads * (total * 4 + slots * 12)
        return rows * (size + new * 12)

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
        return key_redundancy(state.keys, state.key_ok, self.options.similarity)


def registered() -> dict[str, type[Method]]:
    """Every registered method by name (the package's own kinds imported first: ``BUILT_IN_MODULES``)."""
    for module in BUILT_IN_MODULES:
        importlib.import_module(module)
    return METHODS


def eviction_methods() -> list[str]:
    """The names of the registered methods of the G-KV family (``EvictionMethod`` subclasses), in registry order."""
    return [name for name, kind in registered().items() if issubclass(kind, EvictionMethod)]


def method_class(name: str) -> type[Method]:
    """The registered method ``name``; ``package.module:Class`` imports the module (running its code) and
    registers the class under that name (so the configuration, the record and every process of a run name it the
    same way)."""
    methods = registered()
    if name not in methods and ":" in name:
        module, _, attribute = name.partition(":")
        if not module or module.startswith(".") or not attribute:
            raise ValueError(f"compression method {name!r}: give package.module:Class, an absolute module path")
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
        methods[name] = cls
    if name not in methods:
        known = ", ".join(methods)
        raise ValueError(f"unknown compression method {name!r}; choose one of {known}, or package.module:Class")
    return methods[name]


@register
class StreamingLLM(EvictionMethod):
    """StreamingLLM: the ``sinks`` first tokens and the most recent ones."""

    name = "streaming"
    summary = "StreamingLLM: the first 4 tokens and the most recent ones"
    defaults = {**EvictionMethod.defaults, "sinks": 4}

    def score(self, state):
        return state.key_pos.float(), None


@register
class SnapKV(EvictionMethod):
    """SnapKV: the window's attention, max-pooled along the sequence (kernel 5)."""

    name = "snapkv"
    summary = "SnapKV: attention of the last `window` queries, max-pooled (kernel 5)"
    defaults = {**EvictionMethod.defaults, "pool_kernel": 5}

    def score(self, state):
        return self.pool(self.attention(state), state), None


@dataclass
class RedundancyOptions:
    """The attention score against key redundancy (R-KV's term, which G-KV normalises).

    lambda_: weight of the attention score against key redundancy: ``lambda*score - (1-lambda)*redundancy``.
    redundancy: subtract the key-redundancy term.
    similarity: how redundancy sums key similarities: ``rkv`` (the reference's kernel: each key's latest
        near-duplicate, cosine > 0.5, is not counted; O(S^2 D)) or ``mean_cosine`` (every other key; O(S D)).
    """

    lambda_: float = field(default=0.5, metadata={"help": "weight of the attention score against key redundancy"})
    redundancy: bool = field(default=True, metadata={"help": "subtract the key-redundancy term"})
    similarity: str = field(
        default="rkv",
        metadata={
            "help": "how redundancy sums key similarities: rkv (the reference's kernel: each key's latest "
            "near-duplicate, cosine > 0.5, is not counted; O(S^2 D)) or mean_cosine (every other key; O(S D))"
        },
    )

    def __post_init__(self):
        check_unit("lambda", self.lambda_)
        check_choice("similarity", self.similarity, SIMILARITIES)


@dataclass
class RKVOptions(RedundancyOptions):
    lambda_: float = field(default=0.1, metadata={"help": "weight of the attention score against key redundancy"})

    def __post_init__(self):
        super().__post_init__()
        if not self.redundancy:
            raise ValueError("rkv always uses the redundancy term; use snapkv for attention scores alone")


@register
class RKV(SnapKV):
    """R-KV: ``lambda * pooled attention - (1 - lambda) * key redundancy``, both unnormalised (lambda 0.1)."""

    name = "rkv"
    summary = "R-KV: pooled attention minus key redundancy (`lambda` 0.1)"
    Options = RKVOptions

    def score(self, state):
        attention, _ = super().score(state)
        lam = self.options.lambda_
        return lam * attention - (1.0 - lam) * self.redundancy(state), None


@dataclass
class GKVOptions(RedundancyOptions):
    """G-KV's global score: the window's attention normalised by its maximum, blended with its history.

    alpha: history weight (form max: ``max(alpha*old, new)``; mean: ``alpha*old + (1-alpha)*new``; sum:
        ``alpha*old + new``).
    form: how the history is blended: max, mean or sum.
    """

    alpha: float = field(default=0.8, metadata={"help": "history weight of the global score"})
    form: str = field(
        default="max",
        metadata={
            "help": "history form: max (max(alpha*old, new)), mean (alpha*old + (1-alpha)*new) or sum (alpha*old + new)"
        },
    )

    def __post_init__(self):
        super().__post_init__()
        check_unit("alpha", self.alpha)
        check_choice("gkv form", self.form, GKV_FORMS)


@register
class GKV(EvictionMethod):
    """G-KV: the window's attention normalised by its maximum, blended with each token's score history
    (``form`` max: ``max(alpha*old, new)``; mean; sum), pooled when ``pool_kernel`` > 1, minus the key
    redundancy normalised by its maximum: ``lambda * score - (1 - lambda) * redundancy``. The history kept for
    the next compression is the blended score before pooling, for the kept candidates only."""

    name = "gkv"
    summary = (
        "G-KV: max-normalised attention blended with its history (`form` max/mean/sum, `alpha` 0.8), minus "
        "redundancy (`lambda` 0.5)"
    )
    Options = GKVOptions

    def score(self, state):
        options = self.options
        new = normalize_max(self.attention(state), state.candidates)
        history = merge_history(state.history, new, options.form, options.alpha)
        score = self.pool(history, state)
        if options.redundancy:
            redundancy = normalize_max(self.redundancy(state), state.candidates)
            score = options.lambda_ * score - (1.0 - options.lambda_) * redundancy
        return score, history


@dataclass
class H2OOptions(GKVOptions):
    form: str = field(default="sum", metadata={"help": "history form (H2O accumulates: sum)"})
    redundancy: bool = field(default=False, metadata={"help": "subtract the key-redundancy term (H2O: no)"})


@register
class H2O(GKV):
    """H2O as the reference runs it: the attention of the newest query (window 1), normalised by its maximum at
    each compression and accumulated, ``alpha * old + new``; no redundancy."""

    name = "h2o"
    summary = "H2O: the newest query's attention, normalised and accumulated"
    defaults = {**GKV.defaults, "window": 1}
    Options = H2OOptions


@register
class Random(EvictionMethod):
    """Random eviction, per layer and KV head (the control every scorer must beat; reported to match the best
    scorers on reasoning benchmarks, arXiv 2609.03430): at each compression every candidate gets a fresh uniform
    score, a pure function of the rollout's seed, the sequence's row, the layer, the KV head, the token's position
    and the compression's time (``hashed_uniform``), so a rollout is reproducible and independent of padding.
    Sinks and the window are kept as for every method."""

    name = "random"
    summary = "a seeded uniform draw per token and compression: the control every scorer must beat"

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
    summary = "TOVA: the newest query's attention, evicting at every step (`interval` 1)"
    defaults = {**EvictionMethod.defaults, "window": 1, "interval": 1}

    def score(self, state):
        return self.attention(state), None
