"""Forming combined batches: a model call takes ``deviceIterations x
(replicationFactor / input group size) x gradientAccumulation`` micro-batches
at once, one *combined batch*. Two ways to form them from what a torch
``DataLoader`` gives: regroup loaded batches of any size (:func:`rebatched`),
or group the index lists of a user's ``batch_sampler``, which yields
micro-batches (:class:`CombinedBatchSampler`).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence

import torch
import torch.utils.data
from torch.utils import _pytree as pytree

from ._errors import Error
from ._logging import logger


def _zip_structure(fn: Callable[[List[torch.Tensor]], torch.Tensor], batches: List[Any]) -> Any:
    """Applies `fn` to the lists of matching tensors of batches of the same structure."""
    flat = [pytree.tree_flatten(batch) for batch in batches]
    columns = list(zip(*(leaves for leaves, _ in flat)))
    for column in columns:
        if not isinstance(column[0], torch.Tensor):
            raise Error(f"cannot rebatch a batch holding a {type(column[0]).__name__}: batches "
                        "must be tensors, or tuples, lists or dicts of tensors")
    return pytree.tree_unflatten([fn(list(column)) for column in columns], flat[0][1])


def rebatched(batches: Iterable[Any], size: Optional[int], drop_last: bool = True) -> Iterator[Any]:
    """`batches` regrouped into batches of `size` samples, in order (as they
    are if size is None). Samples short of a last whole batch are dropped with
    ``drop_last``, else they make a smaller last batch."""
    if size is None:
        yield from batches
        return
    pending: List[Any] = []
    count = 0
    for batch in batches:
        pending.append(batch)
        count += len(pytree.tree_leaves(batch)[0])
        while count >= size:
            whole = _zip_structure(torch.cat, pending) if len(pending) > 1 else pending[0]
            yield _zip_structure(lambda ts: ts[0][:size], [whole])
            count -= size
            pending = [_zip_structure(lambda ts: ts[0][size:], [whole])] if count else []
    if not count:
        return
    if drop_last:
        logger.debug("dropped %d samples short of a batch of %d (drop_last=True)", count, size)
    else:
        yield _zip_structure(torch.cat, pending) if len(pending) > 1 else pending[0]


class CombinedBatchSampler(torch.utils.data.Sampler[List[int]]):
    """The index lists of ``micro_batches`` consecutive batches of a
    ``batch_sampler``: each list is one combined batch. The micro-batches of
    a combined batch must have one size (the model splits it evenly); with
    ``drop_last`` a last group of fewer micro-batches is dropped."""

    def __init__(self, batch_sampler: Iterable[Sequence[int]], micro_batches: int,
                 drop_last: bool) -> None:
        super().__init__()
        self.batch_sampler = batch_sampler
        self.micro_batches = micro_batches
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[List[int]]:
        group: List[Sequence[int]] = []
        for batch in self.batch_sampler:
            group.append(batch)
            if len(group) == self.micro_batches:
                sizes = {len(b) for b in group}
                if len(sizes) > 1:
                    raise Error(f"batch_sampler yielded micro-batches of {sorted(sizes)} samples "
                                "for one combined batch: the model splits a combined batch into "
                                "micro-batches of one size, so batch_sampler must yield batches "
                                "of one size")
                yield [index for b in group for index in b]
                group = []
        if group and not self.drop_last:
            yield [index for b in group for index in b]

    def __len__(self) -> int:
        batches = len(self.batch_sampler)  # type: ignore[arg-type]
        whole, rest = divmod(batches, self.micro_batches)
        return whole + (1 if rest and not self.drop_last else 0)


def samples_per_epoch(loader: torch.utils.data.DataLoader) -> Optional[int]:
    """The samples a torch DataLoader yields per epoch (None if unknown)."""
    if loader.batch_size is None:
        return None
    if isinstance(loader.dataset, torch.utils.data.IterableDataset):
        try:
            samples = len(loader.dataset)  # type: ignore[arg-type]
        except TypeError:  # no __len__, or one that says it has none
            return None
    else:
        samples = len(loader.sampler)  # type: ignore[arg-type]
    return samples - samples % loader.batch_size if loader.drop_last else samples
