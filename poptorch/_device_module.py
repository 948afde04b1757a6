"""``torch.ipu``: the device module of the ipu, shaped like ``torch.cuda``."""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from . import _C
from ._device_amp import amp
from ._device_streams import (Event, Stream, StreamContext, current_stream, default_stream,
                              set_stream, stream)

from ._device_index import DeviceLike as _DeviceLike, index_of as _index


def is_available() -> bool:
    """True: the ipu device (emulated on the host) is always there."""
    return _C.device_count() > 0


def is_initialized() -> bool:
    """True: the emulated IPUs are ready as soon as poptorch is imported."""
    return True


def init() -> None:
    """Does nothing: the emulated IPUs are ready as soon as poptorch is imported."""


def device_count() -> int:
    """The number of virtual IPUs (``POPTORCH_NUM_IPUS``, 4 by default)."""
    return _C.device_count()


def current_device() -> int:
    return _C.current_device()


def set_device(device: _DeviceLike) -> None:
    _C.set_device(_index(device))


@contextlib.contextmanager
def device(device: _DeviceLike) -> Iterator[None]:
    """Context manager that makes ``device`` the current ipu."""
    previous = _C.current_device()
    _C.set_device(_index(device))
    try:
        yield
    finally:
        _C.set_device(previous)


def synchronize(device: _DeviceLike = None) -> None:
    """Runs every pending ipu operation (all IPUs share one queue); ``device``
    must name an ipu, as CUDA's must name a GPU."""
    _index(device)
    _C.synchronize()


def memory_allocated(device: _DeviceLike = None) -> int:
    """Bytes held by ipu tensors on ``device``."""
    return _C.memory_allocated(_index(device))


def max_memory_allocated(device: _DeviceLike = None) -> int:
    """The peak of :func:`memory_allocated` since the start or the last
    :func:`reset_peak_memory_stats`."""
    return _C.max_memory_allocated(_index(device))


def reset_peak_memory_stats(device: _DeviceLike = None) -> None:
    """Starts :func:`max_memory_allocated` again from what is allocated now."""
    _C.reset_peak_memory_stats(_index(device))


def reset_max_memory_allocated(device: _DeviceLike = None) -> None:
    """As :func:`reset_peak_memory_stats`."""
    _C.reset_peak_memory_stats(_index(device))


def memory_reserved(device: _DeviceLike = None) -> int:
    """Equal to :func:`memory_allocated`: an ipu tensor reserves exactly its bytes
    on its IPU, with no caching allocator in between."""
    return _C.memory_allocated(_index(device))


def max_memory_reserved(device: _DeviceLike = None) -> int:
    """Equal to :func:`max_memory_allocated` (see :func:`memory_reserved`)."""
    return _C.max_memory_allocated(_index(device))


def mem_get_info(device: _DeviceLike = None) -> Tuple[int, int]:
    """``(free, total)`` bytes of the IPU's memory (``POPTORCH_IPU_MEMORY_MB``)."""
    index = _index(device)
    total = _C.memory_capacity(index)
    return total - _C.memory_allocated(index), total


def memory_stats(device: _DeviceLike = None) -> Dict[str, int]:
    """``torch.cuda.memory_stats``'s main keys for the IPU: ``allocated_bytes.all.current``
    and ``.peak``, the same for ``reserved_bytes`` and ``active_bytes`` (an ipu tensor
    reserves exactly its bytes), ``total_bytes`` (the IPU's memory) and
    ``host_cached_bytes`` (host memory the runtime keeps for the temporaries of later
    runs, freed by :func:`empty_cache`; not on the IPU)."""
    index = _index(device)
    current, peak = _C.memory_allocated(index), _C.max_memory_allocated(index)
    stats = {"total_bytes": _C.memory_capacity(index), "host_cached_bytes": _C.idle_arena_bytes()}
    for kind in ("allocated_bytes", "reserved_bytes", "active_bytes"):
        stats[f"{kind}.all.current"] = current
        stats[f"{kind}.all.peak"] = peak
    return stats


def memory_summary(device: _DeviceLike = None, abbreviated: bool = False) -> str:
    """A table of :func:`memory_stats` (``abbreviated`` is accepted and changes nothing:
    the table is short)."""
    index = _index(device)
    stats = memory_stats(index)
    mib = 1024 * 1024
    rows = [f"ipu:{index} memory (IPU Model, emulated on the host)",
            f"  allocated now   {stats['allocated_bytes.all.current'] / mib:12.2f} MiB",
            f"  allocated peak  {stats['allocated_bytes.all.peak'] / mib:12.2f} MiB",
            f"  total           {stats['total_bytes'] / mib:12.2f} MiB",
            f"  host cache      {stats['host_cached_bytes'] / mib:12.2f} MiB (runtime arenas)"]
    return "\n".join(rows) + "\n"


def empty_cache() -> None:
    """Frees the host memory the runtime keeps to hold the temporaries of later runs.
    Tensors' bytes are never cached: freeing an ipu tensor returns its memory to its
    IPU at once, so :func:`memory_allocated` does not change."""
    _C.empty_cache()


def get_device_name(device: _DeviceLike = None) -> str:
    return f"IPU Model (emulated on the host), ipu:{_index(device)}"


def get_device_properties(device: _DeviceLike = None) -> dict:
    index = _index(device)
    return {"name": get_device_name(index), "total_memory": _C.memory_capacity(index)}


def manual_seed(seed: int) -> None:
    """Seeds the ipu's random numbers: they come from the host's default generator
    (each random op draws its seed from it when it is captured), so this is
    ``torch.manual_seed``."""
    torch.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    """As :func:`manual_seed`: every IPU draws from the host's default generator."""
    torch.manual_seed(seed)


def seed() -> None:
    """Seeds the ipu's random numbers (the host's default generator) from a random number."""
    torch.seed()


def seed_all() -> None:
    """As :func:`seed`: every IPU draws from the host's default generator."""
    torch.seed()


def initial_seed() -> int:
    """The host default generator's initial seed, which the ipu draws from."""
    return torch.initial_seed()


def get_rng_state(device: _DeviceLike = None) -> torch.Tensor:
    """The state of the host's default generator, which the ipu's random ops draw
    their seeds from (the same for every IPU; ``device`` is checked only)."""
    _index(device)
    return torch.get_rng_state()


def set_rng_state(new_state: torch.Tensor, device: _DeviceLike = None) -> None:
    """Sets the state of the host's default generator, which the ipu's random ops
    draw their seeds from (see :func:`get_rng_state`)."""
    _index(device)
    torch.set_rng_state(new_state)


def get_rng_state_all() -> List[torch.Tensor]:
    """:func:`get_rng_state` of each IPU (all the same state)."""
    return [torch.get_rng_state() for _ in range(device_count())]


def set_rng_state_all(new_states: Sequence[torch.Tensor]) -> None:
    """Sets the host's default generator from the first state: every IPU draws from it."""
    if len(new_states) > 0:
        torch.set_rng_state(new_states[0])


def _is_in_bad_fork() -> bool:
    return False

