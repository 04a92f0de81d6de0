"""Bit packing of boolean selections (S4R records store one bit per position)."""

from __future__ import annotations

import torch


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """bool [..., n] -> uint8 [..., ceil(n / 8)] (little-endian bit order within each byte)."""
    n = mask.shape[-1]
    padded = torch.nn.functional.pad(mask.to(torch.uint8), (0, (-n) % 8))
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=mask.device)
    return (padded.view(*mask.shape[:-1], -1, 8) * weights).sum(-1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, n: int) -> torch.Tensor:
    """uint8 [..., m] -> bool [..., n]: the inverse of ``pack_bits``."""
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = (packed[..., None] >> shifts) & 1
    return bits.reshape(*packed.shape[:-1], -1)[..., :n].bool()
