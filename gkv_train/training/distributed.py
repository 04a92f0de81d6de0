"""Several CPU processes from ``accelerate launch --num_processes N``.

Without accelerators, ``accelerate launch --num_processes N`` uses its simple launcher, which starts a single
process unless MPI is installed. ``relaunch_cpu_processes`` notices that case (accelerate set ``MASTER_ADDR``
but no ``RANK``), reads N from the launching command and replaces the process with a ``torch.distributed.run``
of N processes; the trainer then runs them on CPU with the gloo backend.

``generation_model`` gives the rollout engine whole weights under DeepSpeed ZeRO-3 (any device).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

import torch


def requested_cpu_processes() -> int:
    """N of the ``accelerate launch --num_processes N`` that started this single CPU process, else 1."""
    if "RANK" in os.environ or "MASTER_ADDR" not in os.environ or torch.cuda.is_available():
        return 1
    try:
        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return 1
    if "launch" not in parent:
        return 1
    from accelerate.commands.launch import launch_command_parser

    args, _ = launch_command_parser().parse_known_args(parent[parent.index("launch") + 1 :])
    return args.num_processes or 1


def relaunch_cpu_processes(script: list[str]) -> None:
    """Re-execute ``script`` (a file, or ``-m module [command]``) with this process's arguments under
    ``torch.distributed.run`` when more CPU processes were asked for."""
    n = requested_cpu_processes()
    if n > 1:
        port = os.environ.get("MASTER_PORT", "29500")
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", f"--master_port={port}"]
        os.execv(sys.executable, command + script + sys.argv[1:])


def is_zero3(accelerator) -> bool:
    """Whether ``accelerator`` trains with DeepSpeed ZeRO stage 3 (each process holds a shard of every weight)."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return plugin is not None and plugin.zero_stage == 3


@contextmanager
def generation_model(trainer):
    """The trainer's model, whole, for the rollout engine (a collective: every process must enter).

    Under DeepSpeed ZeRO-3 each process holds only shards of the weights, and every forward of the model runs
    collectives (gathering each layer's shards; checking at the start of a forward that all processes traced
    the same modules); the engine's decode loop, whose number of steps differs between processes, would then
    deadlock. Like TRL's own generation, this gathers every parameter once for the block and removes ZeRO-3's
    per-module hooks (``trl.models.unwrap_model_for_generation``); it also lifts the start-of-forward hook,
    which TRL leaves (TRL's generation keeps processes in step with ``synced_gpus``). Elsewhere it is the
    unwrapped model. Gradient checkpointing is off inside."""
    from trl.models import unwrap_model_for_generation

    wrapped = trainer.model_wrapped
    with unwrap_model_for_generation(wrapped, trainer.accelerator, gather_deepspeed3_params=True) as model:
        offload = getattr(getattr(wrapped, "optimizer", None), "parameter_offload", None)
        handle = getattr(offload, "fwd_pre_hook", None) if is_zero3(trainer.accelerator) else None
        if handle is None:
            yield model
            return
        hooks = offload.module._forward_pre_hooks  # ordered: put the hook back where it was
        index, hook = list(hooks).index(handle.id), hooks.pop(handle.id)
        try:
            yield model
        finally:
            items = list(hooks.items())
            hooks.clear()
            hooks.update(items[:index] + [(handle.id, hook)] + items[index:])
