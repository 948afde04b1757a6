"""PopTorch's public API, name by name: each exists here and is documented.

The names come from PopTorch's API reference and user guide (module functions
and classes, Options and its groups, PoplarExecutor, poptorch.optim). Names of
features that belong to other open issues are listed in EXPECTED_MISSING with
the issue: the test fails if one of them appears, so that the list shrinks
with the work.
"""
import inspect

import pytest
import torch

import poptorch

MODULE = [
    # model wrapping
    "trainingModel", "inferenceModel", "PoplarExecutor", "isRunningOnIpu",
    # options and enumerations
    "Options", "TensorLocationSettings", "enums", "OutputMode", "ReductionType",
    "MeanReductionStrategy", "DataLoaderMode", "SharingStrategy", "ConnectionType",
    "HalfFloatCastingBehavior", "SyncPattern", "MatMulSerializationMode", "Liveness",
    "OverlapMode", "AutoStage", "MultiConvPlanType", "CommGroupType", "VariableRetrievalMode",
    # data
    "DataLoader", "AsynchronousDataAccessor",
    # helpers
    "ipuHardwareIsAvailable", "ipuHardwareVersion", "setLogLevel", "registerPreCompileHook",
    "registerPostCompileHook", "module_repr", "print", "identity_loss", "ICustomArgParser",
    "registerCustomArgParser",
    # errors
    "Error", "RecoverableError", "UnrecoverableError",
    # optimisers
    "optim",
    # multi-IPU (issue 11)
    "BeginBlock", "Block", "BlockFunction", "removeBlocks", "Stage", "Phase",
    "PipelinedExecution", "ShardedExecution", "SerialPhasedExecution",
    "ParallelPhasedExecution", "recomputationCheckpoint",
    # PopTorch ops, precision, precompilation, profiling (issue 12)
    "load", "autocast", "autocasting", "profiling", "Attribute", "ipu_print_tensor", "nop",
    "for_loop", "cond", "dynamic_slice", "dynamic_update", "CPU", "custom_op", "MultiConv",
    "NameScope", "ctc_beam_search_decoder", "fps", "nearest", "serializedMatMul",
    "set_available_memory", "set_overlap_for_input", "set_overlap_for_output",
]

OPTIONS = {
    "Options": [
        "deviceIterations", "replicationFactor", "inputReplicaGrouping", "outputMode",
        "defaultOutputMode", "anchorTensor", "randomSeed", "updatableNamedBuffers",
        "relaxOptimizerAttributesChecks", "showCompilationProgressBar",
        "enableExecutableCaching", "sourceLocationExcludes", "appendToLocationExcludes",
        "useIpuModel", "useIpuId", "useOfflineIpuTarget", "autoRoundNumIPUs",
        "setExecutionStrategy", "connectionType", "syncPattern", "setAvailableMemoryProportion",
        "enableStableNorm", "enableSyntheticData", "enableProfiling", "modelName", "logDir",
        "logCycleCount", "broadcastBuffers", "disableModuleNamescope", "loadFromFile", "toDict",
        "clone", "Training", "Precision", "TensorLocations", "Jit", "Distributed", "_Popart"],
    "Options.Training": [
        "gradientAccumulation", "accumulationAndReplicationReductionType",
        "setMeanAccumulationAndReplicationReductionStrategy", "setAutomaticLossScaling",
        "setConvolutionDithering"],
    "Options.Precision": [
        "halfFloatCasting", "runningStatisticsAlwaysFloat", "enableFloatingPointExceptions",
        "enableStochasticRounding", "setPartialsType", "autocastEnabled", "autocastPolicy"],
    "Options.TensorLocations": [
        "numIOTiles", "setActivationLocation", "setWeightLocation", "setOptimizerLocation",
        "setAccumulatorLocation"],
    "Options.Jit": ["traceModel"],
    "Options.Distributed": [
        "configureProcessId", "disable", "setEnvVarNames", "processId", "numProcesses"],
    "Options._Popart": ["set", "setEngineOptions", "setPatterns"],
    "TensorLocationSettings": [
        "minElementsForOffChip", "minElementsForReplicatedTensorSharding", "useOnChipStorage",
        "useReplicatedTensorSharding", "useIOTilesToLoad", "useIOTilesToStore"],
}

EXECUTOR = [
    "__call__", "compile", "isCompiled", "isAttachedToDevice", "setOptimizer",
    "copyWeightsToHost", "copyWeightsToDevice", "copyWeightsToHostIfNeeded",
    "copyNamedBuffersToDevice", "load_state_dict", "detachFromDevice", "attachToDevice",
    "destroy", "model", "options", "getTensorNames", "getAnchoredTensor", "rng_state",
    # precompilation and profiling (issue 12)
    "compileAndExport", "save", "loadExecutable", "cycleCount", "compilationTime",
    "getPerfCounters", "getHostIpuLatency", "getComputeLatency", "getIpuHostLatency",
    "getLatency",
]

OPTIM = ["Optimizer", "VariableAttributes", "VariableAttributes.isConstant",
         "VariableAttributes.markAsConstant", "VariableAttributes.markAsVariable", "SGD",
         "Adam", "AdamW", "RMSprop", "LAMB"]

DATA = ["DataLoader.combinedBatchSize", "DataLoader.options", "DataLoader.terminate",
        "AsynchronousDataAccessor.terminate", "AsynchronousDataAccessor.__len__"]

ISSUE_12 = "issue 12 (PopTorch ops, precision, precompilation, profiling)"
EXPECTED_MISSING = {
    **{f"poptorch.{name}": ISSUE_12 for name in ("Attribute",)},
}


def _names():
    yield from (f"poptorch.{name}" for name in MODULE)
    yield from (f"{group}.{name}" for group, names in OPTIONS.items() for name in names)
    yield from (f"PoplarExecutor.{name}" for name in EXECUTOR)
    yield from (f"poptorch.optim.{name}" for name in OPTIM)
    yield from (f"poptorch.{name}" for name in DATA)


def _lookup(name):
    """The object a name refers to; AttributeError if it does not exist."""
    roots = {"poptorch": poptorch, "Options": poptorch.Options(),
             "TensorLocationSettings": poptorch.TensorLocationSettings,
             "PoplarExecutor": poptorch.PoplarExecutor}
    head, *path = name.split(".")
    target = roots[head]
    for part in path:
        # Class attributes as defined (a property, not its value), else the attribute.
        static = inspect.getattr_static(target, part) if not inspect.ismodule(target) else None
        target = static if isinstance(static, property) else getattr(target, part)
    return target


NAMES = list(_names())


def test_the_lists_have_no_duplicates_and_expected_missing_names_are_listed():
    assert len(NAMES) == len(set(NAMES))
    assert set(EXPECTED_MISSING) <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_the_name_exists_and_is_documented(name):
    try:
        target = _lookup(name)
    except AttributeError:
        target = None
    if name in EXPECTED_MISSING:
        assert target is None, (f"{name} exists now: remove it from EXPECTED_MISSING "
                                f"({EXPECTED_MISSING[name]}) so that it is checked")
        return
    assert target is not None, f"{name} is missing"
    doc = inspect.getdoc(target)
    assert doc and doc.strip(), f"{name} has no docstring"


def test_the_model_given_to_training_model_gets_destroy():
    model = torch.nn.Linear(2, 2)
    training = poptorch.trainingModel(model)  # the model is wrapped while this lives
    for name in ("destroy", "copyWeightsToHostIfNeeded"):
        assert inspect.getdoc(getattr(model, name)), name
    training.destroy()



# PopTorch's parameter names (ours may take more after them), so that keyword
# arguments written for PopTorch work.
SIGNATURES = {
    "poptorch.trainingModel": "model options optimizer",
    "poptorch.inferenceModel": "model options",
    "poptorch.setLogLevel": "level",
    "poptorch.module_repr": "m",
    "poptorch.registerPreCompileHook": "hook",
    "poptorch.registerPostCompileHook": "hook",
    "poptorch.DataLoader": "options dataset batch_size shuffle num_workers drop_last "
                           "persistent_workers auto_distributed_partitioning mode async_options "
                           "rebatched_worker_size kwargs",
    "poptorch.AsynchronousDataAccessor": "dataset buffer_size miss_sleep_time_in_ms "
                                         "load_indefinitely early_preload sharing_strategy "
                                         "rebatched_size",
    "Options.outputMode": "output_mode output_return_period",
    "Options.anchorTensor": "short_name long_name output_mode output_return_period",
    "Options.inputReplicaGrouping": "input_group_size input_group_type",
    "Options.useOfflineIpuTarget": "ipu_version",
    "Options.enableProfiling": "profile_dir",
    "Options.relaxOptimizerAttributesChecks": "relax",
    "Options.showCompilationProgressBar": "show",
    "Options.setAvailableMemoryProportion": "available_memory_proportion",
    "Options.autoRoundNumIPUs": "auto_round_num_ipus",
    "Options.updatableNamedBuffers": "buffers",
    "Options.Training.gradientAccumulation": "gradient_accumulation",
    "Options.Training.accumulationAndReplicationReductionType": "reduction_type",
    "Options.Training.setMeanAccumulationAndReplicationReductionStrategy":
        "mean_reduction_strategy",
    "Options.Precision.halfFloatCasting": "half_float_casting",
    "Options.Precision.autocastEnabled": "autocast_enabled",
    "Options.Precision.setPartialsType": "dtype",
    "Options.Precision.enableFloatingPointExceptions": "enabled",
    "Options.Precision.enableStochasticRounding": "enabled",
    "Options.Precision.runningStatisticsAlwaysFloat": "value",
    "Options.TensorLocations.numIOTiles": "num_tiles",
    "Options.Distributed.configureProcessId": "process_id num_processes",
    "Options.Distributed.setEnvVarNames": "var_num_processes var_process_id",
    "PoplarExecutor.load_state_dict": "state_dict strict",
    "poptorch.ipu_print_tensor": "tensor title print_gradient summarise_threshold edge_items "
                                 "max_line_width digits float_format separator open_bracket "
                                 "close_bracket",
    "poptorch.nop": "tensor",
    "poptorch.for_loop": "count body inputs",
    "poptorch.cond": "condition then_body then_inps else_body else_inps",
    "poptorch.dynamic_slice": "tensor dim start size step",
    "poptorch.dynamic_update": "input src dim start size",
    "poptorch.CPU": "layer_to_call ID",
    "poptorch.custom_op": "inputs name domain domain_version example_outputs attributes",
    "poptorch.ctc_beam_search_decoder": "probs lengths blank beam_width top_paths",
    "poptorch.fps": "src ptr ratio random_start",
    "poptorch.nearest": "x y batch_x batch_y",
    "poptorch.serializedMatMul": "lhs rhs mode factor keep_precision",
    "poptorch.set_available_memory": "tensor available_memory_proportion",
    "poptorch.set_overlap_for_input": "input_tensors mode",
    "poptorch.set_overlap_for_output": "output_tensors mode",
    "poptorch.identity_loss": "x reduction",
    "poptorch.optim.SGD": "params lr momentum dampening weight_decay nesterov maximize foreach "
                          "differentiable loss_scaling velocity_scaling use_combined_accum "
                          "accum_type velocity_accum_type max_grad_norm",
    "poptorch.optim.Adam": "params lr betas eps weight_decay amsgrad foreach maximize capturable "
                           "differentiable fused loss_scaling accum_type "
                           "first_order_momentum_accum_type second_order_momentum_accum_type "
                           "max_grad_norm",
    "poptorch.optim.AdamW": "params lr betas eps weight_decay amsgrad maximize foreach "
                            "capturable differentiable fused loss_scaling bias_correction "
                            "accum_type first_order_momentum_accum_type "
                            "second_order_momentum_accum_type max_grad_norm",
    "poptorch.optim.RMSprop": "params lr alpha eps weight_decay momentum centered foreach "
                              "maximize differentiable loss_scaling accum_type "
                              "first_order_momentum_accum_type "
                              "second_order_momentum_accum_type use_tf_variant",
    "poptorch.optim.LAMB": "params lr betas eps weight_decay bias_correction loss_scaling "
                           "max_weight_norm accum_type first_order_momentum_accum_type "
                           "second_order_momentum_accum_type",
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_parameters_are_named_as_in_poptorch(name):
    target = _lookup(name)
    function = target.__init__ if inspect.isclass(target) else target
    names = [p for p in inspect.signature(function).parameters if p != "self"]
    expected = SIGNATURES[name].split()
    assert names[:len(expected)] == expected
