"""``opts.TensorLocations`` and ``poptorch.TensorLocationSettings``: where
classes of tensors live on a real IPU system."""
from __future__ import annotations

from typing import Any, Dict, Optional

from .._errors import AssertionCompatibleError
from .settings import _Settings, _Value
from .values import _bool, _int, _show


class TensorLocationSettings(_Settings):
    """Where a class of tensors lives on a real IPU system (``opts.TensorLocations``).
    Stored and validated; the emulator keeps every tensor in host memory."""

    on_chip = _Value(True, "Keep the tensors in on-chip memory.")
    replicated_tensor_sharding = _Value(False, "Shard the tensors across replicas.")
    min_elements_for_off_chip = _Value(0, "Smallest tensor that may live off-chip.")
    min_elements_for_replicated_tensor_sharding = _Value(
        0, "Smallest tensor that may be sharded across replicas.")
    io_tiles_to_load = _Value(False, "Load the tensors through the I/O tiles.")
    io_tiles_to_store = _Value(False, "Store the tensors through the I/O tiles.")

    def useOnChipStorage(self, use: bool = True) -> TensorLocationSettings:
        """Keep the tensors in on-chip memory (True) or in streaming memory (False)."""
        return self._set("on_chip", _bool("useOnChipStorage", use))

    def useReplicatedTensorSharding(self, use: bool = True) -> TensorLocationSettings:
        """Shard the tensors (weights, optimiser state) across replicas."""
        return self._set("replicated_tensor_sharding", _bool("useReplicatedTensorSharding", use))

    def minElementsForOffChip(self, min_elements: int) -> TensorLocationSettings:
        """Tensors with fewer elements stay on chip."""
        return self._set("min_elements_for_off_chip", _int(
            "minElementsForOffChip", min_elements, 0, "the number of elements"))

    def minElementsForReplicatedTensorSharding(self, min_elements: int) -> TensorLocationSettings:
        """Tensors with fewer elements are not sharded across replicas."""
        return self._set("min_elements_for_replicated_tensor_sharding", _int(
            "minElementsForReplicatedTensorSharding", min_elements, 0, "the number of elements"))

    def useIOTilesToLoad(self, use: bool = True) -> TensorLocationSettings:
        """Load the tensors through the I/O tiles."""
        return self._set("io_tiles_to_load", _bool("useIOTilesToLoad", use))

    def useIOTilesToStore(self, use: bool = True) -> TensorLocationSettings:
        """Store the tensors (replicated tensor sharded ones) through the I/O tiles."""
        return self._set("io_tiles_to_store", _bool("useIOTilesToStore", use))


    # PopTorch's names of the settings, in the dicts its options hold
    _POPTORCH_NAMES = {"on_chip": "onChip",
                       "replicated_tensor_sharding": "useReplicatedTensorSharding",
                       "min_elements_for_off_chip": "minElementsForOffChip",
                       "min_elements_for_replicated_tensor_sharding":
                           "minElementsForReplicatedTensorSharding",
                       "io_tiles_to_load": "useIOTilesToLoad",
                       "io_tiles_to_store": "useIOTilesToStore"}

    def _poptorch_dict(self) -> Dict[str, int]:
        """The settings as PopTorch's ``location_*`` dicts hold them (flags as 0 or 1)."""
        return {name: int(self._values[key]) for key, name in self._POPTORCH_NAMES.items()}


def _location_dict(key: str, doc: str) -> property:
    def get(self: "_TensorLocationOptions") -> Optional[Dict[str, int]]:
        settings = self._values[key]
        return None if settings is None else settings._poptorch_dict()
    return property(get, doc=doc)


class _TensorLocationOptions(_Settings):
    """``opts.TensorLocations``: where activations, weights... live. Stored and
    validated; the emulator keeps every tensor in host memory."""

    _NAME = "TensorLocations"
    activation_location = _Value(None, "Settings for activations.")
    weight_location = _Value(None, "Settings for weights.")
    optimizer_location = _Value(None, "Settings for optimizer state.")
    accumulator_location = _Value(None, "Settings for gradient accumulators.")
    num_io_tiles = _Value(0, "Tiles of each IPU given to I/O rather than compute.")
    # PopTorch's read-only views of the settings, by its names (None until set)
    location_activation = _location_dict("activation_location", "Activations' settings, "
                                         "as PopTorch's dict (``{'onChip': 1, ...}``).")
    location_weight = _location_dict("weight_location", "Weights' settings, as a dict.")
    location_optimizer = _location_dict("optimizer_location",
                                        "The optimiser state's settings, as a dict.")
    location_accumulator = _location_dict("accumulator_location",
                                          "The accumulators' settings, as a dict.")

    def _location(self, method: str, key: str, settings: Any) -> _TensorLocationOptions:
        if not isinstance(settings, TensorLocationSettings):
            raise AssertionCompatibleError(f"TensorLocations.{method} takes a poptorch.TensorLocationSettings, "
                        f"got {_show(settings)}")
        return self._set_not_honoured(method, key, settings)

    def setActivationLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:
        """Where activations live."""
        return self._location("setActivationLocation", "activation_location", location)

    def setWeightLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:
        """Where weights live."""
        return self._location("setWeightLocation", "weight_location", location)

    def setOptimizerLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:
        """Where the optimiser state lives."""
        return self._location("setOptimizerLocation", "optimizer_location", location)

    def setAccumulatorLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:
        """Where the gradient accumulators live."""
        return self._location("setAccumulatorLocation", "accumulator_location", location)

    def numIOTiles(self, num_tiles: int) -> _TensorLocationOptions:
        """Tiles of each IPU given to I/O: an even number from 32 to 192."""
        if isinstance(num_tiles, bool) or not isinstance(num_tiles, int) or \
                not 32 <= num_tiles <= 192 or num_tiles % 2:
            # PopTorch's words, then ours
            raise AssertionCompatibleError(
                "numIOTiles must be an even number between 32 and 192. "
                f"TensorLocations.numIOTiles got {_show(num_tiles)}")
        return self._set_not_honoured("numIOTiles", "num_io_tiles", num_tiles)
