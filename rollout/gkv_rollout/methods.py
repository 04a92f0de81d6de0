"""Compression methods: one small dataclass each, registered by name, whose fields are its options.

A method (``Method``) names itself, says in one line what it does (``summary``: the methods tables of the README
and docs are generated from it), holds its options as its fields with their real defaults, each the key
``compression.<name>`` (the options its kind shares on the kind's base, ``SHARED``, and its own alike), validates
them when built, and builds its cache (``make_cache``); the checks a job runs before any work ask it
(``check_generation``, ``check_model``, ``check_prompts``, ``cache_bytes``). Its identity is its name and its
fields.

The eviction family (``EvictionMethod``): a compression (``gkv_rollout.eviction_cache.EvictionCache.compress``) builds a
``LayerState`` per layer, asks the method for a score per cached token, and keeps the sinks, the window and the
best-scored candidates within the budget (``gkv_rollout.scoring.select_keep``, shared by every method). Defaults
reproduce the reference implementation (microsoft/G-KV at 6db3b2e: ``ScoreBasedKV`` / ``StreamingLLMKV`` with the
recipes of its ``scripts/inference.sh``); options that depart from it are listed in docs/methods.md with their
reasons. S4R (``gkv_rollout.s4r.S4R``) is a method of its own kind: its own cache and record.

Adding a method: a ``@dataclass`` subclass of ``EvictionMethod`` (or a close relative) with a ``name``, a
``summary``, the fields it adds or whose defaults it changes (a shared option's too: a method's fields hold the
only defaults, which every key the configuration does not set takes), and ``score``; decorated with ``@register``
(which runs ``check_method``), ``CompressionConfig(method=name)``, the recipes, every script, the docs' tables and
the registry-driven tests take it. From the user's own code without touching this package:
``compression.method=package.module:Class`` (``gkv_rollout.registry``: the module is imported, its code run, and
the class registered by the same ``register`` under that path and its own name).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from gkv_rollout.eviction_cache import EvictionCache
from gkv_rollout.scoring import (
    LayerState,
    hashed_uniform,
    key_redundancy,
    merge_history,
    normalize_max,
    pool_scores,
    window_attention,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from gkv_rollout.kv_cache import KVCache

GKV_FORMS = ("max", "mean", "sum")
SIMILARITIES = ("rkv", "mean_cosine")
POOLINGS = ("max", "avg")
GROUP_AGGREGATIONS = ("max", "mean")


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


def check_unit(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value}")


def check_choice(what: str, value, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")


METHODS: dict[str, type[Method]] = {}  # by name


def register(cls: type[Method], label: str | None = None) -> type[Method]:
    """Make ``cls`` available as ``CompressionConfig(method=cls.name)`` once it passes ``check_method`` (the checks
    every method passes, built-in or a user's ``package.module:Class``: ``label`` names it in the messages)."""
    check_method(cls, label or f"{cls.__module__}.{cls.__qualname__}")
    METHODS[cls.name] = cls
    return cls


def check_method(cls: type, label: str) -> None:
    """ValueError, naming the method ``label``, unless ``cls`` is a method the configuration can build: a ``Method``
    subclass decorated ``@dataclass`` (below ``@register``), whose fields (its options) all have defaults (a key not
    given takes the method's own), that implements its kind's hooks (an ``EvictionMethod``'s ``score``; another
    kind's ``make_cache`` and ``cache_bytes``) and names itself (``name = '...'``, not a field) with a name no other
    method has."""
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise ValueError(f"compression method {label} is not a Method subclass")
    if "__dataclass_fields__" not in cls.__dict__:  # a plain subclass would run with its base's fields
        raise ValueError(
            f"compression method {label} is not decorated @dataclass (below @register): its fields are its options"
        )
    claimed = {f.name for f in dataclasses.fields(cls)} & {"name", "summary"}
    if claimed:
        raise ValueError(
            f"compression method {label} declares {', '.join(sorted(claimed))} as a field (an option): write "
            "name = '...' without an annotation"
        )
    required = [f.name for f in dataclasses.fields(cls) if f.default is f.default_factory is dataclasses.MISSING]
    if required:
        raise ValueError(
            f"compression method {label}: option {required[0]} has no default (a key not given takes the method's "
            "default): give it one"
        )
    kind = next(base for base in cls.__mro__ if "hooks" in base.__dict__)  # Method, EvictionMethod
    missing = [hook for hook in kind.hooks if getattr(cls, hook) is getattr(kind, hook)]
    if missing:
        raise ValueError(
            f"compression method {label} does not implement {missing[0]}: a {kind.__name__} subclass {kind.hooks_do}"
        )
    if not isinstance(cls.__dict__.get("name"), str):
        raise ValueError(f"compression method {label} does not name itself: give the class a name = '...'")
    known = METHODS.get(cls.name)
    if known is not None and known is not cls:
        raise ValueError(
            f"compression method {label} is named {cls.name!r}, the name of another method "
            f"({known.__module__}.{known.__qualname__}): give it a name of its own"
        )


@dataclass
class Method:
    """A compression method: one dataclass whose fields are its options (with their real defaults; a field's
    help in the class's docstring or its ``metadata``), registered under its ``name`` (``compression.method``)
    with a one-line ``summary``. An instance is a method at its settings, validated when built
    (``__post_init__``); its identity is its name and its fields (``identity``). It builds the cache it runs with
    (``make_cache``), and the checks before a job's work ask it (each does nothing unless a method needs it).

    The options every method of a kind reads live on the base of that kind (the eviction family's budget,
    window, interval, ...: ``EvictionMethod``); ``SHARED`` names them. Every option, shared or its own, is the key
    ``compression.<name>``."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    compresses: ClassVar[bool] = True
    static_decode: ClassVar[bool] = True  # its cache has a static decode step (sampling.compile_decode)
    rounds: ClassVar[bool] = False  # it compresses in rounds, every ``interval`` generated tokens
    # what a method of this kind implements (``check_method``)
    hooks: ClassVar[tuple[str, ...]] = ("make_cache", "cache_bytes")
    hooks_do: ClassVar[str] = "builds its cache and sizes it"

    def identity(self) -> dict:
        """What determines its results: its name and every field's value."""
        return {"method": self.name, **dataclasses.asdict(self)}

    def make_cache(self, model, batch: int, prompt_width: int, max_new: int, device, seed: int = 0) -> KVCache:
        """The KV cache of one batched rollout of ``batch`` sequences (prompts padded to ``prompt_width``, at most
        ``max_new`` new tokens; ``seed``: the rollout's sampling seed)."""
        raise NotImplementedError

    def cache_bytes(self, shape: ModelShape, rows: int, prompt: int, new: int, dtype_bytes: int) -> int:
        """Estimated bytes of one rollout's cache and record: ``rows`` sequences of ``prompt`` (the padded width) +
        ``new`` tokens, cache entries of ``dtype_bytes``."""
        raise NotImplementedError

    def check_generation(self, max_new_tokens: int, key: str) -> None:
        """ValueError when an option makes no sense within a generation of ``max_new_tokens`` (the setting
        ``key``)."""

    def check_model(self, shape: ModelShape) -> None:
        """ValueError when an option exceeds what the model ``shape`` allows."""

    def check_prompts(self, lengths: Sequence[int], which: Callable[[int], str]) -> None:
        """ValueError when a prompt does not suit this method (S4R: one no longer than its sinks; an eviction method
        keeping the prompt: one that fills the budget). ``lengths``: every prompt's tokens; ``which(i)`` names
        prompt ``i`` (its problem and the rollout) for the message."""

    def prompt_limit(self) -> int | None:
        """The prompt length from which ``check_prompts`` refuses a prompt as too long (None: none); the job's checks
        count the prompts near it exactly."""
        return None

    def check_lengths(self, shape: ModelShape, shortest: int, new: int) -> None:
        """ValueError when an option cannot hold for ``shape`` with a prompt of ``shortest`` tokens and ``new``
        generated ones (S4R's eta below its smallest state)."""


# The options a kind of method shares, each a field of its base (``EvictionMethod``, ``S4R``); a method's other fields
# are its own options (every option, shared or own, is the key ``compression.<name>``)
SHARED = ("budget", "window", "interval", "sinks", "keep_prompt", "pool_kernel", "pool", "group_agg")


def own_fields(kind: type[Method]) -> list[dataclasses.Field]:
    """The fields of ``kind`` that are its own options (not ``SHARED``)."""
    return [f for f in dataclasses.fields(kind) if f.name not in SHARED]


def field_default(f: dataclasses.Field):
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def check_scoring(method) -> None:
    """ValueError naming what is wrong with the scoring options of ``method`` (the window, sinks, pooling and GQA
    aggregation, which the eviction family and S4R share)."""
    if method.window <= 0:
        raise ValueError(f"window must be positive, got {method.window}")
    if method.sinks < 0:
        raise ValueError(f"sinks must be >= 0, got {method.sinks}")
    check_choice("pooling", method.pool, POOLINGS)
    if method.pool_kernel < 1 or method.pool_kernel % 2 == 0:
        raise ValueError(f"pool_kernel must be a positive odd number, got {method.pool_kernel}")
    check_choice("group aggregation", method.group_agg, GROUP_AGGREGATIONS)


@register
@dataclass
class Full(Method):
    """No compression: every token's keys and values, always."""

    name = "full"
    summary = "no compression"
    compresses = False

    def make_cache(self, model, batch, prompt_width, max_new, device, seed=0):
        dtype = next(model.parameters()).dtype
        total = prompt_width + max_new
        return EvictionCache(model.config, self, batch, total, total, dtype, device, seed)

    def cache_bytes(self, shape, rows, prompt, new, dtype_bytes):
        return rows * ((prompt + new) * shape.token_bytes(dtype_bytes) + new * 12)


@dataclass
class EvictionMethod(Method):
    """Base of the G-KV family: every ``interval`` generated tokens (and after the prefill when a prompt exceeds the
    budget) keep, per layer and KV head, the sinks (or each sequence's whole prompt: ``keep_prompt``), the last
    ``window`` tokens and the best-scored others within ``budget``; a method implements ``score``.

    budget: tokens each (layer, KV head) keeps after a compression, the window (and a kept prompt) included.
    window: the last ``window`` queries score the cache, and the last ``window`` keys are always kept and never
        scored.
    interval: compress after every ``interval`` generated tokens (and right after prefill when a prompt exceeds
        the budget), so attention never sees more than ``budget + interval`` keys (128: the reference's
        ``divide_length``).
    sinks: the first ``sinks`` tokens are always kept.
    keep_prompt: each sequence's whole prompt (its positions below its own prompt length) is always kept and never
        scored, inside the budget: the budget counts the prompt, the window and what is kept of the rest, so
        methods compare at equal memory. A prompt that with the window leaves no slot of the budget to the rest
        (prompt + window >= budget) is refused before any work, naming both numbers.
    pool_kernel: pooling of scores along the sequence (odd; 1: none).
    pool: how scores are pooled: max or avg.
    group_agg: how the query heads of a GQA group are combined, per window query: max or mean.
    """

    budget: int = 2048
    window: int = 16
    interval: int = 128
    sinks: int = 0
    keep_prompt: bool = False
    pool_kernel: int = 1
    pool: str = "max"
    group_agg: str = "max"

    rounds = True
    hooks = ("score",)
    hooks_do = "gives each cached token its score"

    def __post_init__(self):
        check_scoring(self)
        if self.budget <= self.window:
            raise ValueError(
                f"budget ({self.budget}) must be larger than window ({self.window}): the budget counts the window"
            )
        if self.sinks + self.window > self.budget:
            raise ValueError(f"sinks ({self.sinks}) + window ({self.window}) must fit in the budget ({self.budget})")
        if self.interval <= 0:
            raise ValueError(f"interval must be a positive number of tokens, got {self.interval}")
        if not isinstance(self.keep_prompt, bool):
            raise ValueError(f"keep_prompt must be true or false, got {self.keep_prompt!r}")

    def identity(self) -> dict:
        """Its name and fields, ``keep_prompt`` only when set: the identities of runs from before it was an option
        (their folders' fingerprints, a resumed training's settings) stay what they were."""
        found = super().identity()
        if not self.keep_prompt:
            del found["keep_prompt"]
        return found

    def check_prompts(self, lengths, which):
        """With ``keep_prompt``, the longest prompt must leave room in the budget (``check_kept_prompt``)."""
        if self.keep_prompt and len(lengths):
            longest = max(range(len(lengths)), key=lengths.__getitem__)
            self.check_kept_prompt(int(lengths[longest]), which(longest))

    def prompt_limit(self):
        """With ``keep_prompt``: budget - window, the prompt length that with the window fills the budget."""
        return self.budget - self.window if self.keep_prompt else None

    def check_kept_prompt(self, length: int, which: str) -> None:
        """ValueError when a prompt of ``length`` tokens (``which``, for the message), kept with the window, fills
        the budget: nothing of a completion beyond its window could be kept (and the prompt would not fit once it
        is longer)."""
        if length >= self.budget - self.window:
            raise ValueError(
                f"compression.keep_prompt: {which} has {length} tokens; with the window ({self.window}) it fills "
                f"the budget ({self.budget}), which holds the kept prompt: set compression.budget above "
                f"{length + self.window}, or keep_prompt=false"
            )

    def make_cache(self, model, batch, prompt_width, max_new, device, seed=0):
        """An ``EvictionCache`` sized to the most it ever holds: budget + interval tokens after the first
        compression."""
        dtype = next(model.parameters()).dtype
        total = prompt_width + max_new
        capacity = min(total, max(prompt_width, self.budget) + self.interval)
        return EvictionCache(model.config, self, batch, capacity, total, dtype, device, seed)

    def cache_bytes(self, shape, rows, prompt, new, dtype_bytes):
        """At most max(prompt, budget) + interval slots of keys and values, plus the int32 record of every position
        per layer and KV head and the slots' positions and scores, and the sampled tokens and their log-probs."""
        total = prompt + new
        slots = min(total, max(prompt, self.budget) + self.interval)
        size = slots * shape.token_bytes(dtype_bytes) + shape.layers * shape.kv_heads * (total * 4 + slots * 12)
        return rows * (size + new * 12)

    def score(self, state: LayerState) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(score float32 [B, Hkv, S], new history [B, Hkv, S] or None); higher scores are kept first.
        Only the candidate slots' scores matter, and they must be finite. The cache checks each result where it uses
        it (``gkv_rollout.scoring.checked_score``, ``check_finite``)."""
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
            self.group_agg,
        )

    def pool_scores(self, scores: torch.Tensor, state: LayerState) -> torch.Tensor:
        return pool_scores(scores, state.candidates, self.pool_kernel, self.pool)


@register
@dataclass
class StreamingLLM(EvictionMethod):
    """StreamingLLM: the ``sinks`` first tokens and the most recent ones."""

    name = "streaming"
    summary = "StreamingLLM: the first 4 tokens and the most recent ones"
    sinks: int = 4

    def score(self, state):
        return state.key_pos.float(), None


@register
@dataclass
class SnapKV(EvictionMethod):
    """SnapKV: the window's attention, max-pooled along the sequence (kernel 5)."""

    name = "snapkv"
    summary = "SnapKV: attention of the last `window` queries, max-pooled (kernel 5)"
    pool_kernel: int = 5

    def score(self, state):
        return self.pool_scores(self.attention(state), state), None


def check_similarity(similarity: str) -> None:
    check_choice("similarity", similarity, SIMILARITIES)


@register
@dataclass
class RKV(SnapKV):
    """R-KV: ``lambda * pooled attention - (1 - lambda) * key redundancy``, both unnormalised (lambda 0.1).

    lambda_: weight of the attention score against key redundancy.
    similarity: how redundancy sums key similarities: rkv (the reference's kernel: each key's latest
        near-duplicate, cosine > 0.5, is not counted; O(S^2 D)) or mean_cosine (every other key; O(S D)).
    """

    name = "rkv"
    summary = "R-KV: pooled attention minus key redundancy (`lambda` 0.1)"
    lambda_: float = 0.1
    similarity: str = "rkv"

    def __post_init__(self):
        super().__post_init__()
        check_unit("lambda", self.lambda_)
        check_similarity(self.similarity)

    def score(self, state):
        attention, _ = super().score(state)
        redundancy = key_redundancy(state.keys, state.key_ok, self.similarity)
        return self.lambda_ * attention - (1.0 - self.lambda_) * redundancy, None


@dataclass
class GlobalScore(EvictionMethod):
    """The window's attention normalised by its maximum and blended with each token's score history, pooled when
    ``pool_kernel`` > 1 (G-KV's global score; H2O's accumulation).

    alpha: history weight of the global score.
    form: how the history is blended: max (``max(alpha*old, new)``), mean (``alpha*old + (1-alpha)*new``) or sum
        (``alpha*old + new``).
    """

    alpha: float = 0.8
    form: str = "max"

    def __post_init__(self):
        super().__post_init__()
        check_unit("alpha", self.alpha)
        check_choice("gkv form", self.form, GKV_FORMS)

    def global_score(self, state: LayerState) -> tuple[torch.Tensor, torch.Tensor]:
        """(pooled score, blended history before pooling), both [B, Hkv, S]."""
        new = normalize_max(self.attention(state), state.candidates)
        history = merge_history(state.history, new, self.form, self.alpha)
        return self.pool_scores(history, state), history


@register
@dataclass
class GKV(GlobalScore):
    """G-KV: the window's attention normalised by its maximum, blended with each token's score history
    (``form`` max: ``max(alpha*old, new)``; mean; sum), pooled when ``pool_kernel`` > 1, minus the key
    redundancy normalised by its maximum: ``lambda * score - (1 - lambda) * redundancy``. The history kept for
    the next compression is the blended score before pooling, for the kept candidates only.

    lambda_: weight of the attention score against key redundancy.
    redundancy: subtract the key-redundancy term.
    similarity: how redundancy sums key similarities: rkv (the reference's kernel: each key's latest
        near-duplicate, cosine > 0.5, is not counted; O(S^2 D)) or mean_cosine (every other key; O(S D)).
    """

    name = "gkv"
    summary = (
        "G-KV: max-normalised attention blended with its history (`form` max/mean/sum, `alpha` 0.8), minus "
        "redundancy (`lambda` 0.5)"
    )
    lambda_: float = 0.5
    redundancy: bool = True
    similarity: str = "rkv"

    def __post_init__(self):
        super().__post_init__()
        check_unit("lambda", self.lambda_)
        check_similarity(self.similarity)

    def score(self, state):
        score, history = self.global_score(state)
        if self.redundancy:
            redundancy = normalize_max(key_redundancy(state.keys, state.key_ok, self.similarity), state.candidates)
            score = self.lambda_ * score - (1.0 - self.lambda_) * redundancy
        return score, history


@register
@dataclass
class H2O(GlobalScore):
    """H2O as the reference runs it: the attention of the newest query (window 1), normalised by its maximum at
    each compression and accumulated, ``alpha * old + new``; no redundancy."""

    name = "h2o"
    summary = "H2O: the newest query's attention, normalised and accumulated"
    window: int = 1
    form: str = "sum"

    def score(self, state):
        return self.global_score(state)


@register
@dataclass
class Random(EvictionMethod):
    """Random eviction, per layer and KV head, the prompt not kept (the control every scorer must beat; the
    unprotected ``random`` control of arXiv 2609.03430, whose Random Attention keeps the prompt:
    ``random_attention``): at each compression every candidate gets a fresh uniform score, a pure function of the
    rollout's seed, the sequence's row, the layer, the KV head, the token's position and the compression's time
    (``hashed_uniform``), so a rollout is reproducible and independent of padding; the best-scored candidates are
    kept, a uniformly random subset. Sinks and the window are kept as for every method."""

    name = "random"
    summary = "a seeded uniform draw per token and compression, the prompt not kept: the control every scorer must beat"

    def score(self, state):
        B, Hkv, _ = state.key_pos.shape
        rows = (torch.arange(B, device=state.key_pos.device) if state.rows is None else state.rows)[:, None, None]
        time = (state.key_pos.new_zeros(B) if state.lengths is None else state.lengths)[:, None, None]
        heads = torch.arange(Hkv, device=state.key_pos.device)[None, :, None]
        return hashed_uniform(state.seed, rows, time, state.layer * Hkv + heads, state.key_pos), None


@register
@dataclass
class RandomAttention(Random):
    """Random Attention (arXiv 2609.03430; SalesforceAIResearch/Random-Attention's ``random_pp``): each sequence's
    whole prompt and its last ``window`` (64) tokens kept, the rest of the budget a uniformly random subset of the
    other generated tokens, drawn afresh per layer, KV head and compression (``random``'s draw), every
    ``interval`` (64) generated tokens; the budget counts the prompt and the window, as the authors count it
    (docs/methods.md names where their code differs)."""

    name = "random_attention"
    summary = "Random Attention: the prompt and the last 64 tokens kept, a uniform draw of the rest per KV head"
    window: int = 64
    interval: int = 64
    keep_prompt: bool = True


@register
@dataclass
class TOVA(EvictionMethod):
    """TOVA (Oren et al., 2024, "Transformers are Multi-State RNNs"): at every step (interval 1) the cache over
    budget drops the tokens the newest query attends to least; per layer and KV head here (GQA heads combined by
    max), like every method of this family, where the paper averages a layer's heads; no pooling, no history."""

    name = "tova"
    summary = "TOVA: the newest query's attention, evicting at every step (`interval` 1)"
    window: int = 1
    interval: int = 1

    def score(self, state):
        return self.attention(state), None
