"""poptorch.Options: defaults, chaining, validation, config files, ignored options."""
import copy
import logging
import pickle

import pytest
import torch

import poptorch
from poptorch import (CommGroupType, ConnectionType, Error, HalfFloatCastingBehavior,
                      MeanReductionStrategy, Options, OutputMode, ReductionType, SyncPattern,
                      TensorLocationSettings)
from poptorch._logging import logger
from poptorch.options import _NOT_HONOURED


@pytest.fixture
def log(caplog, monkeypatch):
    """Records of the "poptorch" logger (which does not propagate by default)."""
    monkeypatch.setattr(logger, "propagate", True)
    caplog.set_level(logging.INFO, logger="poptorch")
    return caplog


@pytest.fixture(autouse=True)
def _no_environment_defaults(monkeypatch):
    for name in ("POPTORCH_CACHE_DIR", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "RANK",
                 "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def test_defaults():
    opts = Options()
    assert (opts.device_iterations, opts.replication_factor) == (1, 1)
    assert opts.output_mode is OutputMode.Default and opts.output_return_period == 1
    assert opts.random_seed is None and opts.executable_cache_dir is None
    assert opts.use_ipu_model is True and opts.auto_round_num_ipus is False
    assert opts.Training.gradient_accumulation == 1
    assert opts.Training.accumulation_and_replication_reduction_type is ReductionType.Mean
    assert (opts.Distributed.process_id, opts.Distributed.num_processes) == (0, 1)
    assert opts.Precision.half_float_casting is HalfFloatCastingBehavior.Default
    assert repr(opts) == "Options()"


def test_setters_chain_and_store():
    opts = Options()
    assert opts.deviceIterations(4).replicationFactor(2).randomSeed(7) is opts
    assert opts.Training.gradientAccumulation(3).accumulationAndReplicationReductionType(
        ReductionType.Sum) is opts.Training
    assert opts.Precision.enableStochasticRounding(True).autocastEnabled(True) is opts.Precision
    assert (opts.device_iterations, opts.replication_factor, opts.random_seed) == (4, 2, 7)
    assert opts.Training.gradient_accumulation == 3
    assert opts.Training.accumulation_and_replication_reduction_type is ReductionType.Sum
    assert opts.Precision.stochastic_rounding and opts.Precision.autocast_enabled


def test_properties_are_read_only():
    with pytest.raises(AttributeError, match="read-only"):
        Options().device_iterations = 4


@pytest.mark.parametrize("assign, message", [
    (lambda o: setattr(o, "deviceIterations", 4),
     r"opts.deviceIterations is a setter method: call it, opts.deviceIterations\(4\)"),
    (lambda o: setattr(o.Training, "gradientAccumulation", 2),
     r"opts.Training.gradientAccumulation is a setter method: call it, "
     r"opts.Training.gradientAccumulation\(2\)"),
    (lambda o: setattr(o, "deviceIteration", 4),
     r"opts.deviceIteration: poptorch.Options has no such option.*"
     r"did you mean opts.deviceIterations\(4\)\?"),
    (lambda o: setattr(o, "Training", None), r"opts.Training is a group of options"),
    (lambda o: setattr(o, "device_iterations", 4), r"opts.device_iterations is read-only"),
], ids=["setter", "group setter", "typo", "group", "value"])
def test_an_assignment_to_options_says_how_to_set_them(assign, message):
    # `opts.deviceIterations = 4` replaced the setter, and a misspelt name made
    # an attribute nothing reads: the model ran with the old value, silently.
    opts = Options()
    with pytest.raises(poptorch.Error, match=message) as raised:
        assign(opts)
    assert isinstance(raised.value, AttributeError)
    assert raised.value.location.startswith(__file__)
    assert opts.device_iterations == 1 and opts.Training.gradient_accumulation == 1
    assert callable(opts.deviceIterations) and callable(opts.Training.gradientAccumulation)


def test_groups_are_independent_between_instances():
    first, second = Options(), Options()
    first.Training.gradientAccumulation(5)
    assert second.Training.gradient_accumulation == 1


@pytest.mark.parametrize("call, message", [
    (lambda o: o.deviceIterations(0), r"deviceIterations\(0\).*deviceIterations\(1\) or more"),
    (lambda o: o.replicationFactor(-2), r"replicationFactor\(-2\).*replicationFactor\(1\)"),
    (lambda o: o.Training.gradientAccumulation(0), r"Training.gradientAccumulation\(1\)"),
    (lambda o: o.deviceIterations(2.0), "deviceIterations takes an integer.*float"),
    (lambda o: o.deviceIterations(True), "deviceIterations takes an integer.*bool"),
    (lambda o: o.randomSeed(-1), r"randomSeed\(-1\)"),
    (lambda o: o.randomSeed(2**64), "below 2\\*\\*64"),
    (lambda o: o.useIpuModel("yes"), "useIpuModel takes True or False"),
    (lambda o: o.outputMode("All"), "outputMode takes one of OutputMode.Final"),
    (lambda o: o.outputMode(2), "outputMode takes one of"),
    (lambda o: o.enableExecutableCaching(""), "enableExecutableCaching takes a non-empty"),
    (lambda o: o.Training.accumulationAndReplicationReductionType("Sum"), "ReductionType.Mean"),
    (lambda o: o.TensorLocations.setWeightLocation({}), "TensorLocationSettings"),
    (lambda o: o.Precision.setPartialsType(torch.int32), "torch.float32 or torch.float16"),
    (lambda o: o.Distributed.configureProcessId(2, 2), "less than the number of processes"),
    (lambda o: o.Distributed.configureProcessId(0, 0), "the number of processes"),
    (lambda o: o.connectionType("Always"), "ConnectionType.OnDemand"),
    (lambda o: o.inputReplicaGrouping(0), r"inputReplicaGrouping\(0\) is invalid"),
    (lambda o: o.inputReplicaGrouping(2, CommGroupType.All), "Consecutive or CommGroupType.Orth"),
    (lambda o: o.inputReplicaGrouping(2, 1), "inputReplicaGrouping takes one of CommGroupType"),
    (lambda o: o.useOfflineIpuTarget(3), "the IPU version is 1, 2 or 21"),
    (lambda o: o.updatableNamedBuffers("running_mean"), "takes a list of buffer names"),
    (lambda o: o.updatableNamedBuffers([""]), "takes a list of buffer names"),
    (lambda o: o.setAvailableMemoryProportion({"GPU0": 0.5}), "keys such as 'IPU0'"),
    (lambda o: o.setAvailableMemoryProportion({"IPU0": 0}), "above 0 and at most 1"),
    (lambda o: o.setAvailableMemoryProportion(0.5),
     r"a dict of a proportion per IPU, such as \{'IPU0': 0.5\}"),
    (lambda o: o.TensorLocations.numIOTiles(33), "an even number between 32 and 192"),
    (lambda o: o.TensorLocations.numIOTiles(16), "numIOTiles got 16"),
    (lambda o: o.TensorLocations.numIOTiles(194), "an even number between 32 and 192"),
    (lambda o: o.Training.accumulationAndReplicationReductionType(ReductionType.NoReduction),
     "got ReductionType.NoReduction"),
    (lambda o: o.Training.setMeanAccumulationAndReplicationReductionStrategy("Post"),
     "MeanReductionStrategy.Running"),
    (lambda o: o.Precision.enableFloatingPointExceptions(1), "takes True or False"),
    (lambda o: o.relaxOptimizerAttributesChecks("yes"), "takes True or False"),
    (lambda o: o.showCompilationProgressBar(None), "takes True or False"),
    (lambda o: o.sourceLocationExcludes("torch"), "takes a list of strings"),
    (lambda o: o.anchorTensor("grad", "Gradient___fc.bias", OutputMode.EveryN),
     "needs output_return_period"),
    (lambda o: o.anchorTensor("", "Gradient___fc.bias"), "non-empty string"),
])
def test_invalid_values_raise_error(call, message):
    opts = Options()
    before = opts.toDict()
    with pytest.raises(Error, match=message) as error:
        call(opts)
    assert opts.toDict() == before, "a rejected value must not be stored"
    # PopTorch checks option values with asserts: code catching those still works
    assert isinstance(error.value, AssertionError)


def test_error_is_a_runtime_error():
    with pytest.raises(RuntimeError):
        Options().deviceIterations(0)


def test_output_mode_every_n_needs_a_positive_period():
    opts = Options()
    with pytest.raises(Error, match="needs output_return_period"):
        opts.outputMode(OutputMode.EveryN)
    with pytest.raises(Error, match="output_return_period must be at least 1"):
        opts.outputMode(OutputMode.EveryN, 0)
    opts.outputMode(OutputMode.EveryN, 3)
    assert (opts.output_mode, opts.output_return_period) == (OutputMode.EveryN, 3)


@pytest.mark.parametrize("mode", [OutputMode.All, OutputMode.Final, OutputMode.Sum,
                                  OutputMode.Default])
def test_other_output_modes_ignore_a_period(log, mode):
    """As in PopTorch: the period is ignored, with an INFO message."""
    opts = Options().outputMode(OutputMode.EveryN, 4)
    assert opts.outputMode(mode, 2) is opts
    assert (opts.output_mode, opts.output_return_period) == (mode, 1)
    assert messages(log) == [f"outputMode(OutputMode.{mode.name}, 2): the output return period "
                             "is only used with OutputMode.EveryN and is ignored"]
    opts.outputMode(mode)
    assert (opts.output_mode, opts.output_return_period) == (mode, 1)


def test_input_replica_grouping():
    opts = Options().replicationFactor(4)
    assert opts.input_group_count == 4
    assert opts.inputReplicaGrouping(2, CommGroupType.Orthogonal) is opts
    assert (opts.input_group_size, opts.input_group_type, opts.input_group_count) == (
        2, CommGroupType.Orthogonal, 2)
    opts.replicationFactor(6).inputReplicaGrouping(4)
    with pytest.raises(Error, match=r"a replicationFactor that is a multiple of 4, got "
                                    r"replicationFactor\(6\)"):
        opts.input_group_count  # pylint: disable=pointless-statement


def test_anchor_tensor_entries():
    opts = Options().anchorTensor("grad", "Gradient___fc.bias")
    opts.anchorTensor("w", "UpdatedVar___fc.weight", OutputMode.EveryN, 2)
    opts.anchorTensor("grad", "Gradient___fc.weight", OutputMode.All, 3)  # replaces
    assert opts.anchored_tensors == (("w", "UpdatedVar___fc.weight", OutputMode.EveryN, 2),
                                     ("grad", "Gradient___fc.weight", OutputMode.All, None))


def test_default_output_mode_clone_and_random_seed():
    opts = Options()
    assert opts.defaultOutputMode()
    assert not opts.outputMode(OutputMode.Sum).defaultOutputMode()
    clone = opts.clone()
    clone.Training.gradientAccumulation(3)
    assert clone.toDict() != opts.toDict() and clone.output_mode is OutputMode.Sum
    Options().randomSeed(42)  # seeds the host too, as PopTorch does
    first = torch.rand(3)
    torch.manual_seed(42)
    assert torch.equal(first, torch.rand(3))


def test_cache_dir_defaults_to_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("POPTORCH_CACHE_DIR", str(tmp_path))
    opts = Options()
    assert opts.executable_cache_dir == str(tmp_path)
    assert opts.enableExecutableCaching(tmp_path / "other").executable_cache_dir == \
        str(tmp_path / "other")
    assert opts.enableExecutableCaching(None).executable_cache_dir is None


def test_distributed_defaults_from_mpi_environment(monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    distributed = Options().Distributed
    assert (distributed.process_id, distributed.num_processes) == (2, 4)
    # PopTorch's names of the same values
    assert (distributed.distributed_process_id, distributed.num_distributed_processes) == (2, 4)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "four")
    with pytest.raises(Error, match="OMPI_COMM_WORLD_SIZE"):
        Options()


def test_distributed_defaults_from_torchrun_environment(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    distributed = Options().Distributed
    assert (distributed.processId, distributed.numProcesses) == (1, 3)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")  # OpenMPI's come first
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    assert Options().Distributed.numProcesses == 2
    assert Options().Distributed.disable().numProcesses == 1


def test_distributed_env_var_names(monkeypatch):
    monkeypatch.setenv("MY_SIZE", "4")
    monkeypatch.setenv("MY_ID", "3")
    distributed = Options().Distributed.setEnvVarNames("MY_SIZE", "MY_ID")
    assert (distributed.processId, distributed.numProcesses) == (3, 4)
    monkeypatch.setenv("MY_ID", "4")
    with pytest.raises(Error, match="less than the number of processes"):
        Options().Distributed.setEnvVarNames("MY_SIZE", "MY_ID")
    monkeypatch.setenv("MY_ID", "x")
    with pytest.raises(Error, match="MY_ID='x' must be an integer"):
        Options().Distributed.setEnvVarNames("MY_SIZE", "MY_ID")
    with pytest.raises(Error, match="positive number of seconds"):
        Options().Distributed.setTimeout(0)


def test_tensor_location_settings():
    settings = TensorLocationSettings()
    assert settings.useOnChipStorage(False).minElementsForOffChip(128) is settings
    assert settings.useReplicatedTensorSharding(True).useIOTilesToLoad(True) is settings
    assert settings.minElementsForReplicatedTensorSharding(64).useIOTilesToStore() is settings
    assert settings.toDict() == {"on_chip": False, "replicated_tensor_sharding": True,
                                 "min_elements_for_off_chip": 128,
                                 "min_elements_for_replicated_tensor_sharding": 64,
                                 "io_tiles_to_load": True, "io_tiles_to_store": True}
    with pytest.raises(Error, match="minElementsForOffChip"):
        settings.minElementsForOffChip(-1)
    opts = Options()
    opts.TensorLocations.setWeightLocation(settings)
    assert opts.TensorLocations.weight_location is settings
    assert opts.toDict()["TensorLocations.weight_location"] == settings.toDict()


def test_to_dict_holds_every_value_and_tracks_changes():
    opts = Options()
    values = opts.toDict()
    assert type(values) is dict
    assert values["device_iterations"] == 1 and values["Training.gradient_accumulation"] == 1
    assert values["Distributed.num_processes"] == 1 and "Jit.trace_model" in values
    assert values == Options().toDict()
    opts.Training.gradientAccumulation(2)
    assert opts.toDict() != values
    assert opts.toDict()["Training.gradient_accumulation"] == 2


def test_repr_lists_the_set_options():
    opts = Options().deviceIterations(3).outputMode(OutputMode.All)
    opts.Training.gradientAccumulation(2)
    assert repr(opts) == ("Options(device_iterations=3, output_mode=OutputMode.All, "
                          "Training.gradient_accumulation=2)")


def test_options_copy_and_pickle():
    opts = Options().deviceIterations(5)
    opts.Precision.halfFloatCasting(HalfFloatCastingBehavior.HalfUpcastToFloat)
    for clone in (copy.deepcopy(opts), pickle.loads(pickle.dumps(opts))):
        assert clone.toDict() == opts.toDict()
        clone.deviceIterations(1)
        assert opts.device_iterations == 5


# --- config files -----------------------------------------------------------

def write_config(tmp_path, *lines):
    path = tmp_path / "poptorch.conf"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_load_from_file(tmp_path):
    path = write_config(
        tmp_path,
        "# a comment",
        "deviceIterations(4)",
        "",
        "   replicationFactor(2)  ",
        "Training.gradientAccumulation(8)",
        "Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Sum)",
        "outputMode(OutputMode.EveryN, output_return_period=2)",
        "Precision.halfFloatCasting(poptorch.options.HalfFloatCastingBehavior.HalfUpcastToFloat)",
        "Precision.setPartialsType(torch.float16)",
        "enableExecutableCaching('/tmp/cache')",
        "randomSeed(42)",
        "Distributed.configureProcessId(1, 2)",
        "connectionType(ConnectionType.OnDemand)",
        "inputReplicaGrouping(2, CommGroupType.Orthogonal)",
        "Training.setMeanAccumulationAndReplicationReductionStrategy("
        "poptorch.MeanReductionStrategy.Running)",
        "updatableNamedBuffers(['bn.running_mean'])",
        # The user guide's example (poptorch.conf) builds a strategy.
        "setExecutionStrategy(poptorch.PipelinedExecution(poptorch.Stage('a', 'b'), "
        "Stage('c')))",
    )
    opts = Options()
    assert opts.loadFromFile(path) is opts
    assert (opts.device_iterations, opts.replication_factor, opts.random_seed) == (4, 2, 42)
    assert opts.Training.gradient_accumulation == 8
    assert opts.Training.accumulation_and_replication_reduction_type is ReductionType.Sum
    assert (opts.output_mode, opts.output_return_period) == (OutputMode.EveryN, 2)
    assert opts.Precision.half_float_casting is HalfFloatCastingBehavior.HalfUpcastToFloat
    assert opts.Precision.partials_type is torch.float16
    assert opts.executable_cache_dir == "/tmp/cache"
    assert (opts.Distributed.process_id, opts.Distributed.num_processes) == (1, 2)
    assert opts.connection_type is ConnectionType.OnDemand
    assert (opts.input_group_size, opts.input_group_type) == (2, CommGroupType.Orthogonal)
    assert opts.Training.mean_reduction_strategy is MeanReductionStrategy.Running
    assert (opts.Training.meanAccumulationAndReplicationReductionStrategy
            is MeanReductionStrategy.Running)  # PopTorch's name
    assert opts.updatable_named_buffers == ("bn.running_mean",)
    strategy = opts.execution_strategy
    assert type(strategy) is poptorch.PipelinedExecution
    assert [tuple(strategy.stage(b).blocks) for b in "abc"] == [("a", "b")] * 2 + [("c",)]


def test_default_options_from_the_environment(monkeypatch):
    # PopTorch's POPTORCH_DEFAULT_OPTIONS: setter -> argument(s), enums by name.
    monkeypatch.setenv("POPTORCH_DEFAULT_OPTIONS", (
        '{"deviceIterations": 2, "Precision.enableFloatingPointExceptions": true, '
        '"connectionType": "ConnectionType.OnDemand", "logDir": "OutputMode.Nope", '
        '"_Popart.set": ["saveInitializersToFile", "my_file.onnx"]}'))
    from_environment = Options()
    monkeypatch.delenv("POPTORCH_DEFAULT_OPTIONS")
    explicit = Options().deviceIterations(2).connectionType(ConnectionType.OnDemand)
    explicit.Precision.enableFloatingPointExceptions(True)
    explicit.logDir("OutputMode.Nope")  # not an enum member: the string itself
    explicit._Popart.set("saveInitializersToFile", "my_file.onnx")
    assert repr(from_environment) == repr(explicit) != repr(Options())


@pytest.mark.parametrize("value, message", [
    ("{", "not JSON"), ("[1]", "expected a JSON object"),
    # A path where the JSON goes: the error shows it and says how files load.
    ("/tmp/opts.json", r"not JSON .*got '/tmp/opts.json'.*opts.loadFromFile\(path\)"),
    ('{"deviceIterations": "x"}', r"deviceIterations\('x'\)"),
    ('{"toDict": []}', "is not an option setter"),
])
def test_bad_default_options_name_the_variable(monkeypatch, value, message):
    monkeypatch.setenv("POPTORCH_DEFAULT_OPTIONS", value)
    with pytest.raises(poptorch.options.ConfigFileError,
                       match=f"POPTORCH_DEFAULT_OPTIONS: .*{message}"):
        Options()


def test_load_from_file_does_not_run_code(tmp_path):
    marker = tmp_path / "pwned"
    path = write_config(tmp_path, f"__import__('os').system('touch {marker}')")
    with pytest.raises(Error, match=r"poptorch.conf:1: .*expected one option setter call"):
        Options().loadFromFile(path)
    assert not marker.exists()


@pytest.mark.parametrize("line, message", [
    ("deviceIterations(0)", r"deviceIterations\(0\) is invalid"),
    ("deviceIterations(n)", "'n' is not a literal"),
    ("deviceIterations(1", "not a Python expression"),
    ("deviceIterations = 4", "not a Python expression"),
    ("deviceIterations(1, 2)", "wrong arguments for deviceIterations"),
    ("deviceIterations(*[4])", "is not a literal"),
    ("deviceIterations(**{'device_iterations': 4})", r"\*\* arguments"),
    ("deviceIterations(int('4'))", "'int' cannot be called in a config file"),
    ("setExecutionStrategy(poptorch.Stage.__init__('a'))", "cannot be called"),
    ("options.deviceIterations(4)", "expected one option setter call"),
    ("deviceIterations(4).replicationFactor(2)", "expected one option setter call"),
    ("Training.__class__(4)", "is not an option setter"),
    ("_set('device_iterations', 4)", "is not an option setter"),
    ("toDict()", "is not an option setter"),
    ("loadFromFile('poptorch.conf')", "is not an option setter"),
    ("clone()", "is not an option setter"),
    ("defaultOutputMode()", "is not an option setter"),
    ("input_group_count()", "is not an option setter"),
    ("device_iterations(4)", "is not an option setter"),
    ("Unknown.deviceIterations(4)", "expected one option setter call"),
    ("noSuchOption(4)", "is not an option setter"),
    ("outputMode(OutputMode.Nope)", "'OutputMode.Nope' is not a literal or a member"),
    ("outputMode(os.system)", "'os.system' is not a literal"),
    ("setExecutionStrategy(poptorch.ShardedExecution(n))", "'n' is not a literal"),
    ("Precision.setPartialsType(torch.nn)", "'torch.nn' is not a literal"),
])
def test_a_bad_line_names_file_line_and_problem(tmp_path, line, message):
    path = write_config(tmp_path, "# options", "deviceIterations(2)", line)
    with pytest.raises(poptorch.options.ConfigFileError, match=rf"poptorch\.conf:3: .*{message}"):
        Options().loadFromFile(path)


# --- options the emulator does not honour -----------------------------------

def messages(log):
    return [r.getMessage() for r in log.records if r.name == "poptorch"]


@pytest.mark.parametrize("call, stored, logged", [
    (lambda o: o.useIpuModel(False), ("use_ipu_model", False), "useIpuModel(False)"),
    (lambda o: o.useIpuId(3), ("ipu_id", 3), "useIpuId(3)"),
    (lambda o: o.connectionType(ConnectionType.OnDemand),
     ("connection_type", ConnectionType.OnDemand), "connectionType(ConnectionType.OnDemand)"),
    (lambda o: o.syncPattern(SyncPattern.ReplicaAndLadder),
     ("sync_pattern", SyncPattern.ReplicaAndLadder), "syncPattern(SyncPattern.ReplicaAndLadder)"),
    (lambda o: o.syncPattern(SyncPattern.SinglePipeline),
     ("sync_pattern", SyncPattern.SinglePipeline), "syncPattern(SyncPattern.SinglePipeline)"),
    (lambda o: o.logDir("logs"), ("log_dir", "logs"), "logDir('logs')"),
    (lambda o: o.enableSyntheticData(True), ("synthetic_data", True), "enableSyntheticData"),
    (lambda o: o._Popart.set("autoRecomputation", 3),
     ("_Popart.options", {"autoRecomputation": 3}), "_Popart.set('autoRecomputation', 3)"),
    (lambda o: o.enableStableNorm(False), ("stable_norm", False), "enableStableNorm(False)"),
    (lambda o: o.appendToLocationExcludes("my_lib"),
     ("source_location_excludes", ("/torch/", "/poptorch/", "my_lib")),
     "sourceLocationExcludes(['/torch/', '/poptorch/', 'my_lib'])"),
    (lambda o: o.Training.setConvolutionDithering(True), ("Training.convolution_dithering", True),
     "Training.setConvolutionDithering(True)"),
    (lambda o: o.Precision.enableFloatingPointExceptions(True),
     ("Precision.floating_point_exceptions", True),
     "Precision.enableFloatingPointExceptions(True)"),
    (lambda o: o.TensorLocations.numIOTiles(64), ("TensorLocations.num_io_tiles", 64),
     "TensorLocations.numIOTiles(64)"),
    (lambda o: o.Precision.enableStochasticRounding(True),
     ("Precision.stochastic_rounding", True), "Precision.enableStochasticRounding(True)"),
    (lambda o: o.Precision.setPartialsType(torch.float16),
     ("Precision.partials_type", torch.float16), "Precision.setPartialsType(torch.float16)"),
    (lambda o: o.TensorLocations.setActivationLocation(TensorLocationSettings()),
     ("TensorLocations.activation_location", TensorLocationSettings().toDict()),
     "TensorLocations.setActivationLocation"),
    (lambda o: o.Jit.traceModel(True), ("Jit.trace_model", True), "Jit.traceModel(True)"),
])
def test_an_ignored_option_is_stored_and_logged_once(log, call, stored, logged):
    opts = Options()
    call(opts)
    key, value = stored
    assert opts.toDict()[key] == value
    lines = messages(log)
    assert len(lines) == 1, lines
    assert logged in lines[0] and "the emulated IPU Model ignores it" in lines[0]
    assert all(r.levelno == logging.INFO for r in log.records)


@pytest.mark.parametrize("call", [
    lambda o: o.useIpuModel(True),
    lambda o: o.enableSyntheticData(False),
    lambda o: o.Precision.enableStochasticRounding(False),
    lambda o: o.Precision.halfFloatCasting(HalfFloatCastingBehavior.HalfUpcastToFloat),
    lambda o: o.Precision.halfFloatCasting(HalfFloatCastingBehavior.FloatDowncastToHalf),
    lambda o: o.Precision.runningStatisticsAlwaysFloat(True),
    lambda o: o.Training.setAutomaticLossScaling(True),
    lambda o: o.Precision.autocastEnabled(False),
    lambda o: o.Precision.autocastPolicy(poptorch.autocasting.Policy([torch.bmm])),
    lambda o: o.Distributed.configureProcessId(0, 1),
    lambda o: o.deviceIterations(4).replicationFactor(2).randomSeed(1),
    lambda o: o.Training.gradientAccumulation(4),
    lambda o: o.outputMode(OutputMode.All),
    lambda o: o.outputMode(OutputMode.EveryN, 2),
    lambda o: o.inputReplicaGrouping(2, CommGroupType.Orthogonal),
    lambda o: o.anchorTensor("grad", "Gradient___fc.bias", OutputMode.Sum),
    lambda o: o.updatableNamedBuffers(["bn.running_mean"]),
    lambda o: o.relaxOptimizerAttributesChecks(),
    lambda o: o.showCompilationProgressBar(False),
    lambda o: o.enableStableNorm(True),
    lambda o: o.appendToLocationExcludes(),
    lambda o: o.Training.setMeanAccumulationAndReplicationReductionStrategy(
        MeanReductionStrategy.Post),
    lambda o: o.Training.setMeanAccumulationAndReplicationReductionStrategy(
        MeanReductionStrategy.Running),
    lambda o: o.Precision.enableFloatingPointExceptions(False),
    lambda o: o.useOfflineIpuTarget(21),
    lambda o: o.connectionType(ConnectionType.Never),
    lambda o: o.enableExecutableCaching("/tmp/cache"),
])
def test_what_the_emulator_does_is_not_logged(log, call):
    call(Options())
    assert messages(log) == []


def test_every_not_honoured_entry_names_a_setter():
    opts = Options()
    for option in _NOT_HONOURED:
        target = opts
        *groups, method = option.split(".")
        for group in groups:
            target = getattr(target, group)
        assert callable(getattr(target, method)), option
        why = _NOT_HONOURED[option][1]
        assert f"On the emulated IPU Model: {why}." in getattr(target, method).__doc__, option


def test_the_progress_bar_can_be_hidden(capsys):
    model = torch.nn.Linear(3, 2)
    poptorch_model = poptorch.inferenceModel(model, Options().showCompilationProgressBar(False))
    poptorch_model(torch.ones(2, 3))
    assert "Graph compilation" not in capsys.readouterr().err
    poptorch.inferenceModel(model)(torch.ones(2, 3))
    assert "Graph compilation" in capsys.readouterr().err


def test_options_freeze_once_a_model_or_dataloader_uses_them():
    # As in PopTorch: a model reads its options when it runs, so a change after
    # wrapping would not be what it was compiled for.
    model = torch.nn.Linear(3, 2)
    opts = Options()
    inference = poptorch.inferenceModel(model, opts)
    x = torch.randn(2, 3)
    torch.testing.assert_close(inference(x), model(x))
    with pytest.raises(Error, match=r"can no longer change \(device_iterations\)"):
        opts.deviceIterations(2)
    with pytest.raises(Error, match=r"can no longer change \(Training.gradient_accumulation\)"):
        opts.Training.gradientAccumulation(2)
    torch.testing.assert_close(inference(x), model(x))
    for copied in (opts.clone(), copy.deepcopy(opts), pickle.loads(pickle.dumps(opts))):
        copied.deviceIterations(2).Training.gradientAccumulation(2)
        assert copied.device_iterations == 2 and opts.device_iterations == 1
    loader_opts = Options()
    poptorch.DataLoader(loader_opts, torch.utils.data.TensorDataset(torch.randn(4, 3)))
    with pytest.raises(Error, match="can no longer change"):
        loader_opts._Popart.set("key", 1)


def test_tensor_locations_as_poptorch_dicts():
    """PopTorch's opts.TensorLocations.location_weight etc.: each location's
    settings by PopTorch's names, flags as 0/1; None until set; copies independent."""
    opts = Options()
    assert opts.TensorLocations.location_weight is None
    opts.TensorLocations.setWeightLocation(
        poptorch.TensorLocationSettings().useOnChipStorage(True).minElementsForOffChip(4))
    copied = copy.deepcopy(opts)
    opts.TensorLocations.setWeightLocation(
        poptorch.TensorLocationSettings().useOnChipStorage(False))
    assert copied.TensorLocations.location_weight == {
        "onChip": 1, "useReplicatedTensorSharding": 0, "minElementsForOffChip": 4,
        "minElementsForReplicatedTensorSharding": 0, "useIOTilesToLoad": 0,
        "useIOTilesToStore": 0}
    assert opts.TensorLocations.location_weight["onChip"] == 0
    assert opts.TensorLocations.location_activation is None
