"""``poptorch.ctc_beam_search_decoder``: CTC prefix beam search, as PopLibs
(and TensorFlow) decode. It is the ``poptorch::ctc_beam_search_decoder``
operator, whose CPU kernel the emulated IPU runs as one node of the program.
"""
from __future__ import annotations

import math
from typing import Dict, List, Tuple

import torch

from .._errors import Error

_NEG_INF = -math.inf


def _log_add(*values: float) -> float:
    top = max(values)
    if top == _NEG_INF:
        return _NEG_INF
    return top + math.log(sum(math.exp(v - top) for v in values))


def decode_one(log_probs: List[List[float]], blank: int, beam_width: int,
               top_paths: int) -> List[Tuple[float, Tuple[int, ...]]]:
    """The ``top_paths`` most likely labellings of one sequence (``log_probs``:
    time x classes), with their log probabilities, most likely first."""
    # prefix -> (log p ending in blank, log p ending in a label)
    beams: Dict[Tuple[int, ...], Tuple[float, float]] = {(): (0.0, _NEG_INF)}
    for step in log_probs:
        extended: Dict[Tuple[int, ...], List[float]] = {}

        def add(prefix: Tuple[int, ...], blank_p: float, label_p: float) -> None:
            entry = extended.setdefault(prefix, [_NEG_INF, _NEG_INF])
            entry[0] = _log_add(entry[0], blank_p)
            entry[1] = _log_add(entry[1], label_p)
        for prefix, (p_blank, p_label) in beams.items():
            for label, p in enumerate(step):
                if label == blank:
                    add(prefix, _log_add(p_blank, p_label) + p, _NEG_INF)
                elif prefix and prefix[-1] == label:
                    # A repeat extends the prefix only after a blank; else it merges.
                    add(prefix + (label,), _NEG_INF, p_blank + p)
                    add(prefix, _NEG_INF, p_label + p)
                else:
                    add(prefix + (label,), _NEG_INF, _log_add(p_blank, p_label) + p)
        ranked = sorted(extended.items(), key=lambda kv: (-_log_add(*kv[1]), kv[0]))
        beams = {prefix: (b, l) for prefix, (b, l) in ranked[:beam_width]}
    ranked = sorted(beams.items(), key=lambda kv: (-_log_add(*kv[1]), kv[0]))
    return [(_log_add(*scores), prefix) for prefix, scores in ranked[:top_paths]]


@torch.library.custom_op("poptorch::ctc_beam_search_decoder", mutates_args=(),
                         device_types="cpu")
def _decode(probs: torch.Tensor, lengths: torch.Tensor, blank: int, beam_width: int,
            top_paths: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    time, batch, _ = probs.shape
    scores = torch.full((batch, top_paths), _NEG_INF, dtype=probs.dtype)
    path_lengths = torch.zeros((batch, top_paths), dtype=torch.int32)
    paths = torch.zeros((batch, top_paths, time), dtype=torch.int32)
    values = probs.to(torch.float64)
    for b in range(batch):
        length = int(lengths[b])
        if not 0 <= length <= time:
            raise Error(f"ctc_beam_search_decoder: length {length} of sequence {b} is not "
                        f"between 0 and the input length {time}")
        best = decode_one(values[:length, b].tolist(), blank, beam_width, top_paths)
        for rank, (score, labels) in enumerate(best):
            scores[b, rank] = score
            path_lengths[b, rank] = len(labels)
            paths[b, rank, :len(labels)] = torch.tensor(labels, dtype=torch.int32)
    return scores, path_lengths, paths


@_decode.register_fake
def _decode_fake(probs: torch.Tensor, lengths: torch.Tensor, blank: int, beam_width: int,
                 top_paths: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    time, batch, _ = probs.shape
    return (probs.new_empty((batch, top_paths)),
            probs.new_empty((batch, top_paths), dtype=torch.int32),
            probs.new_empty((batch, top_paths, time), dtype=torch.int32))


def ctc_beam_search_decoder(probs: torch.Tensor, lengths: torch.Tensor, blank: int = 0,
                            beam_width: int = 100,
                            top_paths: int = 1) -> List[torch.Tensor]:
    """The most likely labellings of each sequence by CTC prefix beam search.

    :param probs: Log probabilities, of shape [input_length, batch_size, num_classes].
    :param lengths: The length of each sequence, of shape [batch_size].
    :param blank: The blank class.
    :param beam_width: Prefixes kept at each step.
    :param top_paths: Labellings returned per sequence.
    :returns: The paths' log probabilities [batch_size, top_paths], their
        lengths [batch_size, top_paths] (int32) and the paths
        [batch_size, top_paths, input_length] (int32, zero after each path's
        length). A sequence with fewer distinct labellings than ``top_paths``
        has probability -inf (log 0) for the others.
    """
    if not isinstance(probs, torch.Tensor):
        raise Error("ctc_beam_search_decoder: probs must be a torch.Tensor argument; "
                    f"{type(probs).__name__} is not supported")
    if not isinstance(lengths, torch.Tensor):
        raise Error("ctc_beam_search_decoder: lengths must be a torch.Tensor argument; "
                    f"{type(lengths).__name__} is not supported")
    if probs.dim() != 3 or not probs.is_floating_point():
        raise Error("ctc_beam_search_decoder: probs must be floating-point log probabilities "
                    f"of shape [input_length, batch_size, num_classes], got {probs.dtype} "
                    f"of shape {list(probs.shape)}")
    if lengths.shape != (probs.shape[1],) or lengths.is_floating_point():
        raise Error(f"ctc_beam_search_decoder: lengths must be integers of shape "
                    f"[{probs.shape[1]}], got {lengths.dtype} of shape {list(lengths.shape)}")
    if not 0 <= blank < probs.shape[2]:
        raise Error(f"ctc_beam_search_decoder: blank ({blank}) must be a class index below "
                    f"{probs.shape[2]}")
    for name, value in (("beam_width", beam_width), ("top_paths", top_paths)):
        if not isinstance(value, int) or value < 1:
            raise Error(f"ctc_beam_search_decoder: {name} must be an integer >= 1, got {value!r}")
    if top_paths > beam_width:
        raise Error(f"ctc_beam_search_decoder: top_paths ({top_paths}) cannot exceed "
                    f"beam_width ({beam_width})")
    return list(_decode(probs, lengths, blank, beam_width, top_paths))
