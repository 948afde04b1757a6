"""Replica-grouped weights: replicas of a group share a value of a weight,
replicas of different groups hold different values (PopTorch's
``per_replica_params``, ``param.replicaGrouping()``).

A grouped weight's host tensor has one row per group (``OnePerGroup``) or per
replica (``AllReplicas``) in front of the weight's own shape; its device copy
is that whole tensor, and the host sees every row. Each micro-batch's step
uses the row of its replica: the replica's index is an input of the step
(``replica_index``), and a lookup table gives its row. The gradient of that
row goes to every row of the replica's group (just its own row with one row
per group), so the rows of a group see the same gradients, summed over the
group's replicas only, and stay equal. For ``ReductionType.Mean`` the update
divides them, as every gradient, by all the replicas' micro-batches, as
PopTorch does: a weight cut in shards over the groups then trains as the
whole weight does on the CPU (upstream's replicated_graph_test checks it so).

Replicas are numbered across processes (process ``p`` runs replicas
``p*R .. p*R+R-1``); every process holds every row, and summing the
accumulated gradients across processes sums each row over its group.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

from ._errors import Error
from .enums import CommGroupType, VariableRetrievalMode


@dataclass(frozen=True)
class ReplicaGrouping:
    """How one weight is shared among replicas."""
    comm_group_type: CommGroupType
    shards: int  # replicas per group (Consecutive, Orthogonal)
    retrieval_mode: VariableRetrievalMode

    @staticmethod
    def of(name: str, value: Any) -> "ReplicaGrouping":
        """Checks a ``per_replica_params`` entry: ``(CommGroupType, replicas
        per group, VariableRetrievalMode)``."""
        where = f"per_replica_params[{name!r}]"
        if not isinstance(value, (tuple, list)) or len(value) != 3:
            raise Error(f"{where} must be (CommGroupType, replicas per group, "
                        f"VariableRetrievalMode), got {value!r}")
        kind, shards, mode = value
        if not isinstance(kind, CommGroupType):
            raise Error(f"{where}: the group type must be a poptorch.CommGroupType, got {kind!r}")
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 0:
            raise Error(f"{where}: the replicas per group must be an int >= 0, got {shards!r}")
        if not isinstance(mode, VariableRetrievalMode):
            raise Error(f"{where}: the retrieval mode must be a "
                        f"poptorch.VariableRetrievalMode, got {mode!r}")
        if kind in (CommGroupType.Consecutive, CommGroupType.Orthogonal) and shards < 1:
            raise Error(f"{where}: CommGroupType.{kind.name} needs at least 1 replica per "
                        "group")
        return ReplicaGrouping(kind, shards, mode)

    def group_of(self, replicas: int, name: str) -> List[int]:
        """The group of each of ``replicas`` replicas."""
        kind, size = self.comm_group_type, self.shards
        if kind == CommGroupType.All:
            return [0] * replicas
        if kind == CommGroupType.NoGrouping:
            return list(range(replicas))
        if replicas % size:
            raise Error(f"per_replica_params[{name!r}]: groups of {size} replicas "
                        f"(CommGroupType.{kind.name}) do not divide the {replicas} replicas "
                        "(replicationFactor x processes)")
        groups = replicas // size
        if kind == CommGroupType.Consecutive:
            return [r // size for r in range(replicas)]
        return [r % groups for r in range(replicas)]

    def rows(self, replicas: int, name: str) -> Tuple[List[int], List[int]]:
        """(the row of each replica, the group of each row) of the host tensor."""
        group = self.group_of(replicas, name)
        if self.retrieval_mode == VariableRetrievalMode.AllReplicas:
            return list(range(replicas)), group
        return group, list(range(max(group) + 1))


class _GroupRow(torch.autograd.Function):
    """Row ``row`` of ``weights``; its gradient goes to the rows ``member``
    marks."""

    @staticmethod
    def forward(ctx: Any, weights: torch.Tensor, row: torch.Tensor,
                member: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(member)
        return weights.index_select(0, row).squeeze(0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], None, None]:
        (member,) = ctx.saved_tensors
        spread = member.to(grad.dtype).reshape(-1, *([1] * grad.dim()))
        return spread * grad.unsqueeze(0), None, None


class GroupedWeights:
    """The grouped weights of one captured step."""

    def __init__(self, tables: Dict[str, Tuple[torch.Tensor, torch.Tensor]],
                 local_replicas: int, device: torch.device) -> None:
        self._tables = tables  # name -> (row of each local replica, [replica, row] member mask)
        self._local_replicas = local_replicas
        # The step's extra input: the (local) replica of its micro-batch.
        self.replica_index = torch.zeros(1, dtype=torch.int64, device=device)

    def host_replica_index(self, micro_batches: int) -> torch.Tensor:
        """The replica of each of a call's micro-batches (ordered by iteration,
        accumulation step, then replica), for ``replica_index``."""
        return torch.arange(micro_batches, dtype=torch.int64) % self._local_replicas

    def views(self, tensors: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """While the step is captured: each grouped weight's row for the
        micro-batch's replica, in place of the whole tensor."""
        out = {}
        for name, (rows, member) in self._tables.items():
            row = rows.index_select(0, self.replica_index)
            mask = member.index_select(0, self.replica_index).squeeze(0)
            out[name] = _GroupRow.apply(tensors[name], row, mask)
        return out


def grouped_weights(per_replica_params: Mapping[str, Any], model: torch.nn.Module,
                    options: Any, optimizer: Any, device: torch.device
                    ) -> Optional[GroupedWeights]:
    """Checks the model's grouped weights against the options (and the
    ``DeviceOptimizer`` of a training model); None if it has none."""
    if not per_replica_params:
        return None
    parameters = dict(model.named_parameters(remove_duplicate=False))
    local = options.replication_factor
    first = options.Distributed.process_id * local
    replicas = local * options.Distributed.num_processes
    tables = {}
    for name, value in per_replica_params.items():
        if name not in parameters:
            raise Error(f"per_replica_params names {name!r}, which is not a parameter of the "
                        f"model (its parameters: {sorted(parameters)})")
        grouping = ReplicaGrouping.of(name, value)
        rows, group_of_row = grouping.rows(replicas, name)
        host = parameters[name]
        if host.dim() == 0 or host.shape[0] != len(group_of_row):
            what = ("replica" if grouping.retrieval_mode == VariableRetrievalMode.AllReplicas
                    else "group")
            raise Error(f"per_replica_params[{name!r}]: the parameter must hold one value per "
                        f"{what} in its first dimension ({len(group_of_row)} with "
                        f"CommGroupType.{grouping.comm_group_type.name} over {replicas} "
                        f"replicas), but its shape is {list(host.shape)}")
        if grouping.retrieval_mode == VariableRetrievalMode.AllReplicas:
            _check_rows_agree(name, host, group_of_row)
        group = grouping.group_of(replicas, name)
        member = torch.tensor([[float(group_of_row[h] == group[first + r])
                                for h in range(len(group_of_row))] for r in range(local)])
        tables[name] = (torch.tensor(rows[first:first + local]).to(device), member.to(device))
    if optimizer is not None and (optimizer.algorithm == "lamb"
                                  or optimizer.max_grad_norm is not None):
        what = "LAMB" if optimizer.algorithm == "lamb" else "max_grad_norm"
        raise Error(f"{what} takes norms over whole weights, which would mix the groups of "
                    f"replica-grouped weights ({sorted(tables)}): use another optimiser, "
                    "or no max_grad_norm")
    return GroupedWeights(tables, local, device)


def _check_rows_agree(name: str, host: torch.Tensor, group_of_row: List[int]) -> None:
    """With AllReplicas, the rows of a group are one value: they must start equal."""
    with torch.no_grad():
        for g in sorted(set(group_of_row)):
            rows = [h for h, of in enumerate(group_of_row) if of == g]
            first = host[rows[0]]
            for h in rows[1:]:
                if not torch.equal(host[h], first):
                    raise Error(f"per_replica_params[{name!r}] with "
                                f"VariableRetrievalMode.AllReplicas: rows {rows[0]} and {h} "
                                f"belong to replicas of one group (group {g}), which share "
                                "one value, but they differ; give the replicas of a group "
                                "equal rows")


class _GroupingMethod:
    """``wrapped.W.replicaGrouping(...)`` (``perReplica``, its earlier name):
    records the grouping of parameter ``name`` in the wrapper's
    ``per_replica_params``. The parameter keeps it as an attribute; a copy or
    an unpickled parameter gets one that reaches no wrapper."""

    def __init__(self, wrapper: Any = None, name: str = "") -> None:
        self._wrapper = weakref.ref(wrapper) if wrapper is not None else None
        self._name = name

    def __call__(self, comm_group_type: CommGroupType, shards: int,
                 variable_retrieval_mode: VariableRetrievalMode) -> None:
        wrapper = self._wrapper() if self._wrapper is not None else None
        if wrapper is None:
            raise Error("replicaGrouping: call it on a parameter read from its wrapper "
                        "(poptorch.trainingModel/inferenceModel(model).<name>), or set "
                        "wrapper.per_replica_params[name]")
        value = (comm_group_type, shards, variable_retrieval_mode)
        ReplicaGrouping.of(self._name, value)
        wrapper.per_replica_params[self._name] = value

    def __reduce__(self) -> Any:
        return (_GroupingMethod, ())


def offer_grouping(param: torch.nn.Parameter, wrapper: Any, name: str) -> None:
    """Gives a parameter read from a wrapper (``wrapped.W``) PopTorch's
    ``replicaGrouping`` and ``perReplica`` methods, for that wrapper."""
    method = _GroupingMethod(wrapper, name)
    param.replicaGrouping = method
    param.perReplica = method
