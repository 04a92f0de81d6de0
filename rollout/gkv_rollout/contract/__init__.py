"""The contract between rollout and trainers, the bottom layer: imports nothing else from the project.

* ``record``: the ``Record`` protocol and logical positions; ``eviction.EvictionRecord`` (G-KV family) and
  ``s4r_record.S4RRecord`` implement it, each with the attention context that reproduces it in training.
* ``attention``: the one registered attention function through which rollout caches and training masks
  own a model's attention.
* ``bits``, ``rope``: bit packing and rotary helpers the record formats use.

``RECORD_FORMATS`` lists the record formats; ``record_from_batch`` is the one place that tells them apart.
"""

from __future__ import annotations

from gkv_rollout.contract.eviction import EvictionRecord
from gkv_rollout.contract.record import Record
from gkv_rollout.contract.s4r_record import S4RRecord

RECORD_FORMATS: tuple[type, ...] = (EvictionRecord, S4RRecord)


def record_from_batch(batch) -> Record | None:
    """The record carried by a batch (``Record.to_batch`` entries), or None when it carries none."""
    for format_ in RECORD_FORMATS:
        record = format_.from_batch(batch)
        if record is not None:
            return record
    return None


def attention_context(record: Record | None, model, attention_mask, backend: str = "auto"):
    """The attention context reproducing ``record`` in a forward of ``model`` over a padded batch
    (attention_mask [B, T]); None (plain causal attention) without a record or when the record evicts nothing."""
    return None if record is None else record.attention_context(model, attention_mask, backend)
