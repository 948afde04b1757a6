"""Precompiled models: ``compileAndExport`` / ``save`` write a wrapped model
to a file, and ``poptorch.load`` / ``loadExecutable`` bring it back in
another process, which then compiles nothing.

A file is written by ``torch.save`` and holds two things: a *header* (plain
values: the format, the versions of poptorch and torch, the identity of the
build that compiled the executables, a SHA-256 of the payload), which is read
first with ``weights_only=True``, so that a file of another version or a
damaged file is refused before anything in it runs; and the *payload*, the
``torch.save`` of the model, its optimiser and optimiser state, the options,
the inputs the step was captured from, the random generator's state and the
executables (entries written by the C++ core, see ``csrc/compiler/serialization.h``).

Loading captures the step again from the saved inputs, as PopTorch traces the
model again: the graphs are the ones the exporting process compiled, and their
executables come from the file. Unpickling the payload runs the model's
pickled code, as ``torch.load`` of a model does: load files you trust.
"""
from __future__ import annotations

import hashlib
import io
import os
import pickle
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from . import _C
from ._errors import Error
from ._logging import logger
from ._version import __version__
from .enums import ConnectionType
from .options import Options

_FORMAT = "poptorch.PoplarExecutor"
_FORMAT_VERSION = 1


def _identity() -> Dict[str, Any]:
    """What must match between the exporting and the loading process."""
    return {"format_version": _FORMAT_VERSION, "poptorch": __version__,
            "torch": str(torch.__version__), "build": _C.build_identity()}


def write(filename: str, payload: Dict[str, Any]) -> None:
    """Writes ``payload`` to ``filename`` whole or not at all (a temporary
    file renamed into place)."""
    directory = os.path.dirname(filename)
    if directory:
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as error:
            why = ("a file has that name" if isinstance(error, FileExistsError) else
                   error.strerror or str(error))
            raise Error(f"cannot write {filename}: cannot make its directory {directory} "
                        f"({why}). Save to a path in a directory you can write to") from None
    target = _model_file(filename)
    if target != filename:
        logger.warning("%s is a directory: saving the model to %s", filename, target)
        filename = target
    buffer = io.BytesIO()
    try:
        torch.save(payload, buffer)
    except Exception as error:  # noqa: BLE001 - pickling the model may raise anything
        raise Error(f"cannot write {filename}: the model, its optimiser or its inputs cannot be "
                    f"pickled ({error}). Make them picklable (classes defined at a module's "
                    "top level), or save with export_model=False and call loadExecutable() "
                    "on a model wrapped again") from None
    data = buffer.getvalue()
    header = {"format": _FORMAT, **_identity(), "sha256": hashlib.sha256(data).hexdigest()}
    temporary = f"{filename}.{os.getpid()}.tmp"
    try:
        with open(temporary, "wb") as file:
            torch.save({"header": header, "payload": data}, file)
        os.replace(temporary, filename)
    except OSError as error:
        raise Error(f"cannot write {filename}: {error.strerror or error}. Save to a path in a "
                    "directory you can write to") from None
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def _model_file(filename: str) -> str:
    """Where a model saved to ``filename`` is: ``model.poptorch`` in it when
    it is a directory (``poptorch.load`` of the directory then finds it)."""
    return os.path.join(filename, "model.poptorch") if os.path.isdir(filename) else filename


def read(filename: str) -> Dict[str, Any]:
    """The payload of ``filename``; a clear Error if it is not a file of this
    version of poptorch, or is damaged."""
    filename = _model_file(filename)
    if not os.path.isfile(filename):
        raise Error(f"{filename}: no such file")
    not_ours = (f"{filename} is not a file written by compileAndExport() or save(), or it is "
                f"damaged (truncated, or changed since it was written)")
    try:
        outer = torch.load(filename, weights_only=True)
    except pickle.UnpicklingError:
        # torch's text here advises weights_only=False, which is no remedy for a
        # file that is not ours.
        raise Error(f"{not_ours}: it holds no data torch.save wrote") from None
    except Exception as error:  # noqa: BLE001 - torch raises many kinds for a bad file
        raise Error(f"{not_ours}: {error}") from None
    header = outer.get("header") if isinstance(outer, dict) else None
    data = outer.get("payload") if isinstance(outer, dict) else None
    if (not isinstance(header, dict) or header.get("format") != _FORMAT
            or not isinstance(data, bytes)):
        raise Error(not_ours)
    ours = _identity()
    theirs = {key: header.get(key) for key in ours}
    if theirs != ours:
        raise Error(f"{filename} was exported by poptorch {theirs['poptorch']} with torch "
                    f"{theirs['torch']} (format {theirs['format_version']}, "
                    f"{theirs['build']}); this is poptorch {ours['poptorch']} with torch "
                    f"{ours['torch']} (format {ours['format_version']}, {ours['build']}). "
                    "Precompiled files need the exact build that wrote them: export the model "
                    "again with this one.")
    if hashlib.sha256(data).hexdigest() != header.get("sha256"):
        raise Error(f"{not_ours}: its content does not match its checksum")
    try:
        with warnings.catch_warnings():
            # torch 2.13 warns about its own code when it unpickles an input spec.
            warnings.filterwarnings("ignore", r".*isinstance\(treespec, LeafSpec\)",
                                    FutureWarning)
            return torch.load(io.BytesIO(data), weights_only=False)
    except Exception as error:  # noqa: BLE001 - the model's own unpickling may raise anything
        raise Error(f"{filename}: the model it holds cannot be loaded here ({error}); its "
                    "classes must be importable, as for torch.load") from None


def payload(executor: Any, export_model: bool, save_rng_state: bool) -> Dict[str, Any]:
    """What ``save`` writes of a compiled ``executor``."""
    _C.synchronize()  # the host weights and optimiser state alias the device's
    optimizer = executor._optimizer if export_model and executor._training else None
    # Automatic loss scaling's current scale lives on the device; the state
    # dict's load_state_dict does not restore it.
    scale = None
    if optimizer is not None and executor._device_optimizer.automatic_loss_scaling:
        scale = float(executor._device_optimizer.loss_scaling)
    return {
        "training": executor._training,
        "model": executor._model if export_model else None,
        "options": executor._options,
        "optimizer": optimizer,
        "optimizer_state": optimizer.state_dict() if optimizer is not None else None,
        "loss_scaling": scale,
        "inputs": {"spec": executor._spec, "examples": executor._examples,
                   "objects": executor._input_objects},
        "rng_state": executor.rng_state if save_rng_state else None,
        "capture_seed": executor._capture_seed,
        "per_replica_params": dict(executor.per_replica_params),
        "executables": list(executor._executables.entries()),
    }


def add_executables(executables: "_C.ExecutableSet", filename: str,
                    saved: Dict[str, Any]) -> None:
    """Adds the executables of a payload to ``executables``, checking each."""
    for entry in saved["executables"]:
        try:
            executables.add(entry)
        except RuntimeError as error:
            raise Error(f"{filename} holds an executable that cannot be used: {error}") from None


def inputs(saved: Dict[str, Any]) -> Tuple[Any, List[Any], List[Any]]:
    """(spec, example micro-batch, custom objects) of a payload."""
    given = saved["inputs"]
    return given["spec"], given["examples"], given["objects"]


def as_loaded(options: Options) -> None:
    """The options of a loaded model, less what belongs to the exporting
    machine: it runs (an offline target is for compiling), and caches
    executables where this process does (POPTORCH_CACHE_DIR)."""
    options._set("ipu_version", None)
    if options.connection_type == ConnectionType.Never:
        options.connectionType(ConnectionType.Always)
    options.enableExecutableCaching(os.environ.get("POPTORCH_CACHE_DIR") or None)


def load(filename: str, edit_opts_fn: Optional[Callable[[Options], None]] = None) -> Any:
    """See ``poptorch.load``."""
    from ._executor import inferenceModel, trainingModel  # the executor imports this module

    saved = read(filename)
    if saved["model"] is None:
        raise Error(f"{filename} was written with export_model=False: it holds no model. Wrap "
                    "the model with poptorch.trainingModel or poptorch.inferenceModel, then "
                    f"call loadExecutable({filename!r}) on it.")
    options = saved["options"]
    as_loaded(options)
    if edit_opts_fn is not None:
        edit_opts_fn(options)
    optimizer = saved["optimizer"]
    if optimizer is not None and saved["optimizer_state"] is not None:
        optimizer.load_state_dict(saved["optimizer_state"])
    if saved["training"]:
        executor = trainingModel(saved["model"], options, optimizer)
    else:
        executor = inferenceModel(saved["model"], options)
    executor.per_replica_params.update(saved.get("per_replica_params", {}))
    executor._load(filename, saved)
    if saved.get("loss_scaling") is not None:
        with torch.no_grad():  # an upload: the captured graphs stay the same
            executor._device_optimizer.loss_scaling.copy_(torch.tensor(saved["loss_scaling"]))
    if saved["rng_state"] is not None:
        executor.rng_state = saved["rng_state"]
    return executor
