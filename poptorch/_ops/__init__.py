"""PopTorch's ops (the user guide's "PopTorch ops"): each is a module of its own."""
from .annotations import (MultiConv, nop, recomputationCheckpoint, serializedMatMul,
                          set_available_memory, set_overlap_for_input, set_overlap_for_output)
from .control_flow import cond, for_loop
from .ctc_decoder import ctc_beam_search_decoder
from .custom import custom_op
from .host_callback import CPU
from .name_scope import NameScope
from .point_clouds import fps, nearest
from .printing import ipu_print_tensor
from .slicing import dynamic_slice, dynamic_update

__all__ = ["CPU", "MultiConv", "NameScope", "cond", "ctc_beam_search_decoder", "custom_op",
           "dynamic_slice", "dynamic_update", "for_loop", "fps", "ipu_print_tensor", "nearest",
           "nop", "recomputationCheckpoint", "serializedMatMul", "set_available_memory",
           "set_overlap_for_input", "set_overlap_for_output"]
