"""What PopTorch's ``PoplarExecutor`` exposes of a wrapped model's state: its
weights and buffers (``load_state_dict``, ``copyNamedBuffersToDevice``,
``copyWeightsToHostIfNeeded``), its random generator (``rng_state``) and its
anchored tensors (``getTensorNames``, ``getAnchoredTensor``; see ``_anchors.py``).

The host model's tensors alias the device's (``_device_state.py``), so the
host never holds stale weights, and ``load_state_dict`` into the model writes
the device at once.
"""
from __future__ import annotations

from typing import Any, List, Mapping

import torch

from . import _C
from ._anchors import tensor_names
from ._errors import AssertionCompatibleError, Error
from ._logging import logger


class WrapperState:
    """Methods of PoplarExecutor (which provides ``_model``, ``_options``,
    ``_training``, ``_state``, ``_attached``, ``_compiled``, ``_anchored``,
    ``_rng``, ``_replica_buffers`` and ``_lock``)."""

    def getTensorNames(self) -> List[str]:
        """The names of the tensors ``Options.anchorTensor`` may anchor: the
        model's parameters and buffers and, for training, ``Gradient___<name>``
        and ``UpdatedVar___<name>`` of each trainable parameter. The model
        must be compiled."""
        if not self._compiled:
            raise AssertionCompatibleError("getTensorNames: the model is not compiled yet: "
                                           "call it (or compile()) first")
        return tensor_names(self._model, self._training)

    def getAnchoredTensor(self, short_name: str) -> torch.Tensor:
        """The value of the tensor anchored as ``short_name`` in the last call,
        gathered over its micro-batches per the anchor's output mode."""
        with self._lock:
            if short_name not in self._anchored:
                anchored = [entry[0] for entry in self._options.anchored_tensors]
                raise Error(f"getAnchoredTensor: no tensor anchored as {short_name!r} was "
                            f"returned" + (f" (anchored: {anchored})" if anchored else
                                           ": anchor it with Options.anchorTensor") +
                            "; anchored tensors are returned by each call of the model")
            return self._anchored[short_name]

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> Any:
        """Loads ``state_dict`` into the wrapped model (``Module.load_state_dict``,
        whose result it returns) and so into the device's weights."""
        with self._lock:
            result = self._model.load_state_dict(state_dict, strict)
            if self._attached:
                self._state.copy_to_device()  # for tensors the load replaced
            return result

    def copyWeightsToHostIfNeeded(self) -> bool:
        """PopTorch copies the device's weights to the host when they changed
        since the last copy and returns True. Here the host tensors alias the
        device's and are never out of date: it runs pending work and returns False."""
        _C.synchronize()
        return False

    def copyNamedBuffersToDevice(self) -> None:
        """Copies the buffers named in ``Options.updatableNamedBuffers`` from the
        model to the device, including buffers the model was given anew
        (``model.register_buffer(name, new)``) since it was wrapped."""
        with self._lock:
            names = self._options.updatable_named_buffers
            if not names:
                raise Error("copyNamedBuffersToDevice: no buffer is updatable: name them with "
                            "Options.updatableNamedBuffers([...]) before wrapping the model")
            buffers = dict(self._model.named_buffers())
            unknown = [name for name in names if name not in buffers]
            if unknown:
                raise Error(f"copyNamedBuffersToDevice: the model has no buffer {unknown}; its "
                            f"buffers are {sorted(buffers)}")
            if not self._attached:
                raise Error("copyNamedBuffersToDevice: the model is not attached to the IPU "
                            "(call it, or attachToDevice(), first)")
            self._state.copy_to_device({name: buffers[name] for name in names})
            if self._replica_buffers is not None:
                self._replica_buffers.reset()  # every replica takes the host's values

    def _copy_host_changes(self) -> None:
        """Before a run: weights the user changed on the host other than in
        place (``param.data = t``, a tensor assigned to a module's attribute)
        reach the device, where PopTorch needs a copyWeightsToDevice() and
        would run with the old values otherwise."""
        changed = self._state.changed_on_the_host(self._training)
        if not changed:
            return
        logger.debug("copying the weights changed on the host to the device: %s", sorted(changed))
        self._state.copy_to_device(changed)
        if self._replica_buffers is not None and not changed.keys().isdisjoint(
                self._state.buffer_names):
            self._replica_buffers.reset()  # every replica takes the host's values

    @property
    def rng_state(self) -> List[int]:
        """The state of the generator that seeds each call's random ops: its
        seed, then its state's bytes. Setting it back replays the same random
        numbers in the calls that follow."""
        with self._lock:
            return [self._rng.initial_seed()] + self._rng.get_state().tolist()

    @rng_state.setter
    def rng_state(self, state: List[int]) -> None:
        with self._lock:
            expected = self._rng.get_state().numel() + 1
            if len(state) != expected or not all(isinstance(v, int) for v in state):
                raise Error(f"rng_state takes the list of {expected} integers that reading "
                            f"rng_state gave")
            try:
                self._rng.set_state(torch.tensor(state[1:], dtype=torch.uint8))
            except (RuntimeError, OverflowError) as error:
                raise Error(f"rng_state: not a state that rng_state gave ({error})") from None
