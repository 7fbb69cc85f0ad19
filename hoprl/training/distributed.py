"""A job in several processes: who writes, what is shared, and the check that ranks agree.

``processes: N`` (job hyperparameter) runs the job's worker under ``accelerate launch`` (DDP,
DeepSpeed ZeRO or FSDP: accelerate and TRL do the distributed work; nothing here is a runtime of
its own). On CPU the ranks talk over gloo; on GPUs over NCCL. What this module adds is the
project's part of running in several processes:

- **one writer**: only rank 0 writes the run registry (status, metrics, episodes, checkpoints,
  stage switches) and the files beside checkpoints; TRL already saves weights from rank 0 only;
- **one view of a step**: every rank rolls out its own share of the step's groups; the episodes,
  their rewards and totals are gathered (:func:`gather`), so rank 0 stores the whole step once and
  every rank takes curriculum decisions on the same numbers;
- **one decision**: a value only one rank should compute (EVO-RAG's dev return) is computed on rank
  0 and broadcast (:func:`on_main`);
- **one set of weights**: at the end, each rank's weight digest is gathered and compared
  (:func:`weights_digest`); DDP keeps them equal, and a job whose ranks drifted fails loudly.

Before the trainer builds its ``Accelerator`` the rank comes from torchrun's environment
(``RANK``, ``WORLD_SIZE``), so the worker knows whether to write the run's status.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def _cpu_rank_location(storage: Any, location: str) -> Any:
    """Restores a storage saved or mapped to ``cpu:<rank>`` on the CPU.

    transformers 5.17 resumes a multi-process job's optimizer state with ``map_location =
    args.device``, which on a CPU-only DDP job is ``cpu:<local rank>``; torch's own CPU
    deserializer accepts only ``cpu`` and the resume fails ("don't know how to restore data
    location ... cpu:0", measured). Registered through torch's public ``register_package``, the
    hook torch provides for such locations (transformers 5.24 no longer maps there)."""
    if location.startswith("cpu:"):
        return storage.cpu()
    return None


torch.serialization.register_package(30, lambda _storage: None, _cpu_rank_location)


def rank() -> int:
    """This process's global rank (0 outside a distributed launch)."""
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """The job's number of processes (1 outside a distributed launch)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main() -> bool:
    """Whether this process writes the registry and the checkpoint files (rank 0)."""
    return rank() == 0


def distributed() -> bool:
    """Whether a process group is running (several processes, after the Accelerator started it)."""
    return world_size() > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()


def gather(items: list[T]) -> list[T]:
    """Every rank's ``items`` concatenated in rank order, on every rank (one process: ``items``).

    A collective: every rank must call it, the same number of times, in the same order.
    """
    if not distributed():
        return list(items)
    from accelerate.utils import gather_object

    return list(gather_object(list(items)))


def on_main(compute: Callable[[], T]) -> T:
    """``compute()`` on rank 0, its result broadcast to every rank (a collective, like :func:`gather`)."""
    if not distributed():
        return compute()
    from accelerate.utils import broadcast_object_list

    box: list[Any] = [compute() if is_main() else None]
    broadcast_object_list(box, from_process=0)
    result: T = box[0]
    return result


def weights_digest(model: Any) -> str:
    """SHA-256 of the model's parameters and buffers, in ``state_dict`` order (bytes as stored)."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def rank_digests(model: Any) -> list[str]:
    """Each rank's :func:`weights_digest`, in rank order, on every rank."""
    return gather([weights_digest(model)])
