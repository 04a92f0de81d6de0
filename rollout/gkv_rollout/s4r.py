"""S4R, the method (Low-Rank plus Sparse reconstruction): its options (the dataclass's fields), their checks against
the model, the prompts and the generation, and its memory. Its cache, which runs it in the rollout, is
``gkv_rollout.s4r_cache.S4RCache``; its record ``gkv_rollout.contract.s4r_record.S4RRecord``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gkv_rollout.lowrank import check_eta
from gkv_rollout.methods import Method, ModelShape, check_scoring, register
from gkv_rollout.s4r_cache import S4RCache

BASES = ("sampled", "prompt")  # what the bases are fitted on: the paper's sample, or every prompt token
EXACT = ("none", "keys", "values", "both")  # the control's exact reconstructions


def _help(text: str) -> dict:
    return {"help": " ".join(text.split())}


@register
@dataclass
class S4R(Method):
    """S4R: exact sinks, rank-r coefficients from SVD bases of sampled pre-RoPE keys and values, latent scoring at
    every step, the top tokens reconstructed (``S4RCache``, its record ``S4RRecord``; docs/s4r.md).

    window: the last ``window`` queries score the cache in the latent space; the last ``window`` tokens are always
        reconstructed.
    sinks: the first ``sinks`` tokens are kept exact.
    pool_kernel: pooling of the latent scores along the sequence (odd; 1: none).
    pool: how scores are pooled: max or avg.
    group_agg: how the query heads of a GQA group are combined: max or mean.
    """

    name = "s4r"
    summary = (
        "exact sinks + rank-r coefficients from SVD bases of pre-RoPE K/V, latent scoring, top tokens "
        "reconstructed ([docs/s4r.md](docs/s4r.md))"
    )
    static_decode = False  # it scores and reconstructs at every step, outside any graph

    window: int = 32
    sinks: int = 4
    pool_kernel: int = 7
    pool: str = "max"
    group_agg: str = "mean"
    eta: float = field(
        default=0.2,
        metadata=_help("""persistent-memory share: the rank is solved so that the stored state (exact sinks, the
        coefficients of every token, the query window, the bases) is a share eta of the full KV cache when the
        sequence reaches expected_length tokens; eta also sets the share of prompt tokens sampled for the bases and
        rho by default. The achieved share of each sample is reported (memory_share)."""),
    )
    expected_length: int | None = field(
        default=None,
        metadata=_help("""sequence length (prompt + completion) at which eta holds; None: each prompt's length +
        max_new_tokens (the end of the longest generation); 0: the prompt's length (the paper's setting, for
        prompt-only workloads; over a long generation the share then falls, e.g. 0.2 asked, ~0.08 after 1024 tokens
        on a 146-token prompt)."""),
    )
    rank: int | None = field(default=None, metadata=_help("key rank (None: from eta)"))
    rank_v: int | None = field(default=None, metadata=_help("value rank (None: rank)"))
    rank_ratio: float = field(
        default=1.0,
        metadata=_help("""value rank over key rank when eta sets the rank: the two split the coefficients of the
        rank r eta gives, r_k + r_v = 2 r (the paper's Table 8 compares 1:1, 1:1.5 and 1:2); 1, the default: r_k = r_v =
        r. Only without rank / rank_v."""),
    )
    basis: str = field(
        default="sampled",
        metadata=_help("""the prompt tokens the bases are fitted on: sampled (the paper's: a share eta of the
        non-sink prompt tokens, recent_ratio of them the most recent, the rest uniform) or prompt (every non-sink
        prompt token, ShadowKV's choice: a departure from the paper that costs a larger SVD at prefill and keeps
        the tokens outside the paper's sample, a retrieval needle, in the subspace)."""),
    )
    refresh: int = field(
        default=0,
        metadata=_help("""bases that follow the generation (an extension beyond the paper; 0, the default: off, the
        paper's bases from the prompt alone): every refresh generated tokens each layer's key and value bases gain
        the refresh_rank leading directions of what they miss of the last refresh tokens' states (the residual's
        SVD). The rank budget is kept: the prompt's bases start that many columns short of the rank eta gives; a
        token keeps the columns that existed when it was written (the record says which)."""),
    )
    refresh_rank: int = field(
        default=2, metadata=_help("directions each refresh adds to the key and to the value bases")
    )
    rho: float | None = field(
        default=None, metadata=_help("share of the cache reconstructed each step, window included (None: eta)")
    )
    recent_ratio: float = field(
        default=0.7, metadata=_help("share of the sampled prompt tokens taken from the most recent ones (7:3)")
    )
    normalize: bool = field(
        default=True, metadata=_help("normalise sampled key/value vectors to unit length before the SVD")
    )
    full_layers: list[int] = field(
        default_factory=list, metadata=_help("layers that reconstruct every token instead of a top-k selection")
    )
    exact: str = field(
        default="none",
        metadata=_help("""a control, not a compression: the chosen tokens attend with their exact keys, values or
        both (none, keys, values, both) instead of the reconstructed ones, the selection staying S4R's; every
        token's exact state is kept besides its coefficients for that, so the memory is not S4R's (memory_share
        reports S4R's own state). Separates what the reconstruction loses from what the selection misses."""),
    )

    def __post_init__(self):
        check_scoring(self)
        if not 0.0 < self.eta <= 1.0:
            raise ValueError(f"eta must lie in (0, 1], got {self.eta}")
        if self.rho is None:
            self.rho = self.eta
        if not 0.0 < self.rho <= 1.0:
            raise ValueError(f"rho must lie in (0, 1], got {self.rho}")
        if self.expected_length is not None and self.expected_length < 0:
            raise ValueError(f"expected_length must be >= 0 (0: the prompt's length), got {self.expected_length}")
        if self.refresh < 0 or self.refresh_rank < 1:
            raise ValueError(
                f"refresh must be >= 0 (0: off) and refresh_rank >= 1, got {self.refresh}, {self.refresh_rank}"
            )
        if 0 < self.refresh < self.refresh_rank:
            raise ValueError(
                f"refresh ({self.refresh} tokens) must be at least refresh_rank ({self.refresh_rank}): "
                "each refresh takes its directions from that many tokens"
            )
        for name in ("rank", "rank_v"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not (math.isfinite(self.rank_ratio) and self.rank_ratio > 0):
            raise ValueError(f"rank_ratio must be a positive number, got {self.rank_ratio}")
        if self.rank_ratio != 1.0 and (self.rank is not None or self.rank_v is not None):
            raise ValueError(
                f"rank_ratio={self.rank_ratio} splits the rank eta gives; with rank / rank_v set, set the two "
                "ranks instead"
            )
        if self.basis not in BASES:
            raise ValueError(f"basis must be one of {', '.join(BASES)}, got {self.basis!r}")
        if self.exact not in EXACT:
            raise ValueError(f"exact must be one of {', '.join(EXACT)}, got {self.exact!r}")
        if self.exact != "none" and self.refresh:
            raise ValueError("exact (a control of the prompt's bases) and refresh do not go together: set refresh=0")
        if not 0.0 <= self.recent_ratio <= 1.0:
            raise ValueError(f"recent_ratio must lie in [0, 1], got {self.recent_ratio}")
        if any(layer < 0 for layer in self.full_layers):
            raise ValueError(f"full_layers must be layer indices, got {self.full_layers}")

    def make_cache(self, model, batch, prompt_width, max_new, device, seed=0):
        return S4RCache(model, self, batch, prompt_width, max_new, device)

    def cache_bytes(self, shape: ModelShape, rows, prompt, new, dtype_bytes):
        """The prompt's exact K and V during prefill, then float32 coefficients at rank <= D' per token (keys and
        values), the window's float64 score sums, the bit-packed selections of every generated token, and with
        ``refresh`` the last ``refresh`` tokens' float32 pre-RoPE keys and values; plus the sampled tokens and
        their log-probs (12 bytes per token); the ``exact`` control keeps every token's exact keys, values or both
        besides."""
        L, G, total = shape.layers, shape.heads // shape.kv_heads, prompt + new
        rank = max(self.rank or 0, self.rank_v or 0) or shape.latent_dim  # the eta rank is at most D'
        size = prompt * shape.token_bytes(dtype_bytes) + L * total * (2 * rank * 4 + G * 8) + L * new * (total + 7) // 8
        size += 2 * L * min(self.refresh, new) * shape.latent_dim * 4
        exact_sides = {"none": 0, "keys": 1, "values": 1, "both": 2}[self.exact]
        size += total * shape.token_bytes(dtype_bytes) * exact_sides // 2  # the exact states
        size += exact_sides * L * shape.latent_dim**2 * 4  # the record's identity bases (float32 D' x D' a layer)
        return rows * (size + new * 12)

    def check_generation(self, max_new_tokens, key):
        if self.refresh >= max_new_tokens:
            raise ValueError(
                f"compression.refresh={self.refresh} refreshes nothing in a generation of "
                f"{max_new_tokens} tokens ({key}): set it below {max_new_tokens}, or 0 for no refresh"
            )

    def check_model(self, shape: ModelShape):
        """Ranks within the model's D' (a larger one would be cut to D', and the run recorded as what was given),
        and ``full_layers`` among the model's layers (another index would be ignored)."""
        beyond = [layer for layer in self.full_layers if layer >= shape.layers]
        if beyond:
            raise ValueError(
                f"compression.full_layers={list(self.full_layers)}: {shape.name} has layers 0-{shape.layers - 1}"
            )
        for key in ("rank", "rank_v"):
            value = getattr(self, key)
            if value is not None and value > shape.latent_dim:
                raise ValueError(
                    f"compression.{key}={value} exceeds what {shape.name} allows: an S4R basis has at most KV "
                    f"heads x head dim = {shape.kv_heads} x {shape.head_dim} = {shape.latent_dim} columns"
                )

    def check_lengths(self, shape: ModelShape, shortest, new):
        expected = self.expected_length
        length = shortest + new if expected is None else max(shortest, expected)
        groups = shape.heads // shape.kv_heads
        check_eta(self.eta, self.sinks, length - self.sinks, shape.latent_dim, groups, self.window)

    def check_prompts(self, lengths, which):
        shortest = min(range(len(lengths)), key=lengths.__getitem__, default=None)
        if shortest is not None and lengths[shortest] <= self.sinks:
            raise ValueError(
                f"s4r needs prompts longer than its {self.sinks} sinks (compression.sinks); {which(shortest)} has "
                f"{lengths[shortest]} tokens"
            )
