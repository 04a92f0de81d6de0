"""Configuration of the compressed cache and of sampling, validated when built."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field

GKV_FAMILY = ("streaming", "snapkv", "h2o", "rkv", "gkv")
METHODS = ("full", *GKV_FAMILY, "s4r")
GKV_FORMS = ("max", "mean", "sum")
POOLINGS = ("max", "avg")
GROUP_AGGREGATIONS = ("max", "mean")


@dataclass
class CompressionConfig:
    """How the KV cache is compressed during decoding; every method works per layer and per KV head.

    method: ``full`` (no compression), one of the G-KV family (evicting, every ``interval`` tokens):
        ``streaming`` (sinks + most recent), ``snapkv`` (window attention, pooled), ``h2o`` (window attention
        accumulated over compressions: ``alpha * old + new``), ``rkv`` (attention minus key redundancy), ``gkv``
        (max-normalised attention blended with its history by ``form``, optionally minus redundancy); or
        ``s4r`` (low-rank cache with sparse reconstruction, scored every step: see ``rollout.s4r``).
    budget: tokens each (layer, KV head) keeps after a compression, the window included (G-KV family).
    window: the last ``window`` queries score the cache, and the last ``window`` keys are always kept
        (default 16; 32 for ``s4r``, its W).
    interval: compress after every ``interval`` generated tokens (and right after prefill when a prompt
        exceeds the budget), so attention never sees more than ``budget + interval`` keys.
    alpha: history weight (``gkv``: ``max(alpha*old, new)``, ``alpha*old + (1-alpha)*new``, or
        ``alpha*old + new`` for the forms max/mean/sum; ``h2o``: decay of the accumulated sum).
    lambda_: weight of the attention score against key redundancy: ``lambda*score - (1-lambda)*redundancy``.
    form: ``gkv`` history form, one of max/mean/sum.
    redundancy: subtract the key-redundancy term (always on for ``rkv``, optional for ``gkv``).
    pool_kernel, pool: pooling of scores along the sequence (odd kernel; 1 disables it).
    group_agg: how the query heads of a GQA group are combined (max; mean for ``s4r``).
    sinks: the first ``sinks`` tokens are always kept (``streaming`` and ``s4r`` default to 4, others to 0).
    eta: ``s4r`` target retention: sets the rank (persistent-memory ratio at the prompt length), the share of
        prompt tokens sampled for the bases, and ``rho`` by default.
    rank, rank_v: ``s4r`` key / value ranks (None: from ``eta``; ``rank_v`` defaults to ``rank``).
    rho: ``s4r`` share of the cache reconstructed each step (window included); None: ``eta``.
    recent_ratio: ``s4r`` share of the sampled prompt tokens taken from the most recent ones (7:3 = 0.7).
    normalize: ``s4r`` normalises sampled key/value vectors to unit length before the SVD.
    full_layers: ``s4r`` layers that reconstruct every token instead of a top-k selection.
    Options left at None take the method's default (``num_sinks``, ``kernel``, ``uses_redundancy``,
    ``num_window``, ``aggregation``, ``rho_``), resolved on use so that changing ``method`` never keeps
    another method's defaults.
    """

    method: str = "full"
    budget: int = 2048
    window: int | None = None
    interval: int = 128
    alpha: float = 0.8
    lambda_: float = 0.5
    form: str = "max"
    redundancy: bool | None = None
    pool_kernel: int | None = None
    pool: str = "max"
    group_agg: str | None = None
    sinks: int | None = None
    eta: float = 0.2
    rank: int | None = None
    rank_v: int | None = None
    rho: float | None = None
    recent_ratio: float = 0.7
    normalize: bool = True
    full_layers: list[int] = field(default_factory=list)

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown compression method {self.method!r}; choose one of {', '.join(METHODS)}")
        if self.method == "full":
            return
        if self.num_window <= 0:
            raise ValueError(f"window must be positive, got {self.num_window}")
        if self.num_sinks < 0:
            raise ValueError(f"sinks must be >= 0, got {self.num_sinks}")
        if self.pool not in POOLINGS:
            raise ValueError(f"unknown pooling {self.pool!r}; choose one of {', '.join(POOLINGS)}")
        if self.kernel < 1 or self.kernel % 2 == 0:
            raise ValueError(f"pool_kernel must be a positive odd number, got {self.kernel}")
        if self.aggregation not in GROUP_AGGREGATIONS:
            raise ValueError(f"unknown group aggregation {self.aggregation!r}; choose one of {', '.join(GROUP_AGGREGATIONS)}")
        if self.method == "s4r":
            self._validate_s4r()
        else:
            self._validate_gkv_family()

    def _validate_gkv_family(self):
        W = self.num_window
        if self.budget <= W:
            raise ValueError(f"budget ({self.budget}) must be larger than window ({W}): the budget counts the window")
        if self.num_sinks + W > self.budget:
            raise ValueError(f"sinks ({self.num_sinks}) + window ({W}) must fit in the budget ({self.budget})")
        if self.interval <= 0:
            raise ValueError(f"interval must be a positive number of tokens, got {self.interval}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must lie in [0, 1], got {self.alpha}")
        if not 0.0 <= self.lambda_ <= 1.0:
            raise ValueError(f"lambda must lie in [0, 1], got {self.lambda_}")
        if self.form not in GKV_FORMS:
            raise ValueError(f"unknown gkv form {self.form!r}; choose one of {', '.join(GKV_FORMS)}")
        if self.method == "rkv" and not self.uses_redundancy:
            raise ValueError("rkv always uses the redundancy term; use snapkv for attention scores alone")

    def _validate_s4r(self):
        if not 0.0 < self.eta <= 1.0:
            raise ValueError(f"eta must lie in (0, 1], got {self.eta}")
        if not 0.0 < self.rho_ <= 1.0:
            raise ValueError(f"rho must lie in (0, 1], got {self.rho_}")
        for name in ("rank", "rank_v"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0.0 <= self.recent_ratio <= 1.0:
            raise ValueError(f"recent_ratio must lie in [0, 1], got {self.recent_ratio}")
        if any(layer < 0 for layer in self.full_layers):
            raise ValueError(f"full_layers must be layer indices, got {self.full_layers}")

    @property
    def compresses(self) -> bool:
        return self.method != "full"

    # Options left at None take the method's default, resolved here so that changing ``method`` (say, from a
    # command line) never keeps another method's defaults.
    @property
    def num_sinks(self) -> int:
        return self.sinks if self.sinks is not None else 4 if self.method in ("streaming", "s4r") else 0

    @property
    def num_window(self) -> int:
        return self.window if self.window is not None else 32 if self.method == "s4r" else 16

    @property
    def aggregation(self) -> str:
        return self.group_agg if self.group_agg is not None else "mean" if self.method == "s4r" else "max"

    @property
    def rho_(self) -> float:
        return self.rho if self.rho is not None else self.eta

    @property
    def kernel(self) -> int:
        return self.pool_kernel if self.pool_kernel is not None else 1 if self.method in ("streaming", "h2o") else 7

    @property
    def uses_redundancy(self) -> bool:
        return self.redundancy if self.redundancy is not None else self.method in ("rkv", "gkv")


@dataclass(frozen=True)
class SamplingConfig:
    """How completions are sampled.

    temperature: 0 means greedy (log-probs are then those of the unscaled distribution).
    top_p: nucleus sampling; log-probs are always those of softmax(logits / temperature) without the nucleus
        cut, the distribution the trainer recomputes.
    stop_token_ids: tokens that end a completion (the model's EOS when None); the stop token is kept.
    ignore_eos: never sample a stop token (forces ``max_new_tokens``, for benchmarks).
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    num_samples: int = 1
    seed: int = 0
    stop_token_ids: tuple[int, ...] | None = None
    ignore_eos: bool = False

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be at least 1, got {self.num_samples}")


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def add_compression_args(parser, **defaults) -> None:
    """Add one ``--option`` per ``CompressionConfig`` field to an argparse parser (``--lambda`` for ``lambda_``)."""
    hints = typing.get_type_hints(CompressionConfig)
    for f in dataclasses.fields(CompressionConfig):
        kind = hints[f.name]
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # X | None -> X
            kind = next(t for t in typing.get_args(kind) if t is not type(None))
        flag = "--" + f.name.rstrip("_").replace("_", "-")
        if typing.get_origin(kind) is list:
            parser.add_argument(flag, dest=f.name, default=defaults.get(f.name, []), type=int, nargs="*")
            continue
        parser.add_argument(flag, dest=f.name, default=defaults.get(f.name, f.default), type=_parse_bool if kind is bool else kind)


def compression_from_args(args) -> CompressionConfig:
    """The validated ``CompressionConfig`` of options added by ``add_compression_args``."""
    return CompressionConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(CompressionConfig)})
