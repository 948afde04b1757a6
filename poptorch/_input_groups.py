"""``Options.inputReplicaGrouping``: replicas of one input group share their input.

A host batch then holds ``deviceIterations x gradientAccumulation x
(replicationFactor / input group size)`` micro-batches. Before it reaches the
runtime, which feeds every replica a micro-batch of its own, each group's
micro-batch is repeated for the replicas of the group: replica ``r`` reads the
micro-batch of group ``r // size`` (``Consecutive``) or ``r % groups``
(``Orthogonal``).
"""
from __future__ import annotations

from typing import Any, List

import torch

from ._errors import Error
from .enums import CommGroupType
from .options import Options


def expand_input_groups(leaves: List[Any], options: Options, accumulation: int) -> List[Any]:
    """The inputs with a micro-batch per replica (as they are without grouping).
    ``accumulation`` is the micro-batches of an update (1 for inference)."""
    size = options.input_group_size
    if size == 1:
        return leaves
    groups = options.input_group_count
    replicas = options.replication_factor
    outer = options.device_iterations * accumulation
    if options.input_group_type == CommGroupType.Consecutive:
        group_of = [replica // size for replica in range(replicas)]
    else:
        group_of = [replica % groups for replica in range(replicas)]
    index = torch.tensor(group_of)
    expanded = []
    for position, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            if leaf.shape[0] % (outer * groups):
                raise Error(
                    f"input {position} has {leaf.shape[0]} rows: with "
                    f"inputReplicaGrouping({size}) a host batch must be a multiple of "
                    f"deviceIterations ({options.device_iterations}) x gradientAccumulation "
                    f"({accumulation}) x replicationFactor / input group size ({groups}) = "
                    f"{outer * groups} micro-batches. Use poptorch.DataLoader(options, ...), "
                    f"which makes such batches.")
            micro = leaf.shape[0] // (outer * groups)
            rest = leaf.shape[1:]
            leaf = (leaf.reshape(outer, groups, micro, *rest)
                    .index_select(1, index.to(leaf.device))
                    .reshape(outer * replicas * micro, *rest))
        expanded.append(leaf)
    return expanded


def group_rows(expanded: torch.Tensor, options: Options, accumulation: int) -> torch.Tensor:
    """The rows of an expanded input that the first replica of each group read:
    the shape the caller gave (for writing in-place changes back)."""
    groups = options.input_group_count
    replicas = options.replication_factor
    outer = options.device_iterations * accumulation
    micro = expanded.shape[0] // (outer * replicas)
    if options.input_group_type == CommGroupType.Consecutive:
        first = [group * options.input_group_size for group in range(groups)]
    else:
        first = list(range(groups))
    rest = expanded.shape[1:]
    return (expanded.reshape(outer, replicas, micro, *rest)
            .index_select(1, torch.tensor(first, device=expanded.device))
            .reshape(outer * groups * micro, *rest))
