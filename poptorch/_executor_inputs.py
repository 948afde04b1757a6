"""How PopTorch's ``PoplarExecutor`` takes its inputs: a call's arguments
bound to ``forward`` and flattened to tensor leaves (float64 demoted, as
PopTorch does), each call checked against the inputs the step was compiled
for, in PopTorch's words (``Shape mismatch for x: ...``), and inputs the step
changes in place written back to the caller's tensors, as on the CPU.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch

from . import _inputs
from ._errors import Error
from ._float64 import DEMOTED
from ._input_groups import expand_input_groups, group_rows
from ._logging import logger



def _describe(value: Any) -> str:
    """A value for an error message: a tensor by its shape and dtype, not its elements."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)} and dtype {value.dtype}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

class ExecutorInputs:
    """Methods of PoplarExecutor (which provides ``_model``, ``_options``,
    ``_training``, ``_accumulation``, ``_micro_batches``, ``_spec``,
    ``_input_specs``, ``_step``, ``_micro_step`` and the ``_warned_*`` flags)."""

    def _flatten(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[List[Any], Any]:
        """The inputs' leaves and their spec (see _inputs.py). IPUs have no
        64-bit floating point, so float64 (complex128) inputs become float32
        (complex64), as in PopTorch; `_given` keeps the caller's tensors."""
        args, kwargs, call_keywords = _inputs.bind(self._model.forward, args, kwargs)
        given, spec, self._input_objects = _inputs.flatten(args, kwargs, call_keywords)
        self._given = [leaf for leaf in given if isinstance(leaf, torch.Tensor)]
        leaves = list(given)
        for index, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor) and leaf.requires_grad and not self._warned_grad:
                # PopTorch's words: the step's outputs do not flow back to the inputs.
                logger.warning("input %d: Input tensor has requires_grad=True set.This tensor "
                               "will be detached. (No gradient reaches it from the IPU.)",
                               index)
                self._warned_grad = True
            if isinstance(leaf, torch.Tensor) and leaf.dtype in DEMOTED:
                if not self._warned_float64:
                    logger.warning("input %d is %s: IPUs have no 64-bit floating point, so "
                                   "64-bit inputs are demoted to 32 bits (as PopTorch does)",
                                   index, leaf.dtype)
                    self._warned_float64 = True
                leaves[index] = leaf.to(DEMOTED[leaf.dtype])
        return expand_input_groups(leaves, self._options, self._accumulation), spec

    def _batch_message(self, index: int, leaf: torch.Tensor) -> str:
        o = self._options
        n = self._micro_batches
        return (f"input {index} has {leaf.shape[0]} rows: a host batch must be a multiple of "
                f"deviceIterations ({o.device_iterations}) x replicationFactor "
                f"({o.replication_factor})" +
                (f" x gradientAccumulation ({self._accumulation})" if self._training else "") +
                f" = {n} micro-batches. Use poptorch.DataLoader(options, ...), which makes "
                f"batches of batch_size x {n}.")

    def _check_inputs(self, leaves: List[Any], spec: Any) -> None:
        if spec != self._spec:
            names = _inputs.positional_names(self._model.forward)
            raise Error(f"{_inputs.describe_change(self._spec, spec, names)}: the model was "
                        "compiled for inputs of another structure. PopTorch compiles a static "
                        "graph: call destroy() (or wrap the model again) for new kinds of input.")
        for index, (leaf, expected) in enumerate(zip(leaves, self._input_specs)):
            shape, dtype, value = expected
            # What every steady call has: each input as compiled. The names
            # (pytree paths, the signature) are looked up for a mismatch only.
            if isinstance(leaf, torch.Tensor):
                if shape is not None and leaf.dtype == dtype and tuple(leaf.shape) == shape:
                    continue
            elif shape is None and not leaf != value:
                continue
            self._check_input(index, leaf, spec, expected)

    def _check_input(self, index: int, leaf: Any, spec: Any,
                     expected: Tuple[Any, Any, Any]) -> None:
        """Raises if input leaf ``index`` is not what the step was compiled for."""
        shape, dtype, value = expected
        leaf_names = _inputs.leaf_names(spec, _inputs.positional_names(self._model.forward))
        name = leaf_names[index] if leaf_names else f"input {index}"
        static = ("PopTorch compiles a static graph, so shapes and dtypes must stay the same "
                  "(use drop_last=True in the DataLoader, or call destroy() to compile again)")
        if shape is None:
            if isinstance(leaf, torch.Tensor) or leaf != value:
                raise Error(f"Value mismatch for {name}: expected {_describe(value)} but got "
                            f"{_describe(leaf)}: the model was compiled with this input fixed; "
                            "only tensor inputs may change between calls (call destroy() to "
                            "compile again)")
        elif not isinstance(leaf, torch.Tensor):
            raise Error(f"Type mismatch for {name}: expected Tensor but got "
                        f"{type(leaf).__name__}: {static}")
        elif tuple(leaf.shape) != shape:
            if leaf.dim() == len(shape) > 1 and leaf.shape[0] == shape[0]:
                # Not a short last batch: a sequence that grows (a generation loop), say.
                static = ("PopTorch compiles a static graph, so shapes must stay the same: pad "
                          "the input to one length (the longest), or call destroy() to compile "
                          "again; lazy mode (model.to('ipu')) compiles each new shape once and "
                          "keeps it")
            raise Error(f"Shape mismatch for {name}: expected {torch.Size(shape)} but got "
                        f"{leaf.shape}: {static}")
        elif leaf.dtype != dtype:
            raise Error(f"Dtype mismatch for {name}: expected {dtype} but got {leaf.dtype}: "
                        f"{static}")

    def _write_back(self, inputs: List[torch.Tensor], host_inputs: List[torch.Tensor]) -> None:
        """Inputs the step changes in place (``x += 1``, ``out=``) change for the
        caller too, as on the CPU. The runtime wrote the host copies; a copy
        that is not the caller's tensor is copied back."""
        for given, host, device in zip(inputs, host_inputs, self._step.device_inputs):
            if not self._micro_step.writes(device):
                continue
            if given.dim() == 0:
                host = host[-1]  # the last micro-batch's value, as after a CPU loop
            elif host.shape != given.shape:  # replicas of an input group shared its rows
                host = group_rows(host, self._options, self._accumulation)
            if not host.is_set_to(given):
                with torch.no_grad():
                    given.copy_(host)
