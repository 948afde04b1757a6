"""PyTorch's generic streams and events on the ipu (``torch.Stream("ipu")``,
``torch.Event("ipu")``), as documented for every device: the ipu's device guard does
their work, so they behave as CUDA's do, on the emulated IPUs' one in-order queue."""
import pytest
import torch

import poptorch


def _pending_work() -> torch.Tensor:
    y = torch.ones(3).to("ipu") * 2
    assert poptorch._C.pending_nodes() > 0
    return y


def test_new_streams_are_distinct_streams_of_the_ipu():
    a, b = torch.Stream("ipu"), torch.Stream("ipu:1", priority=-1)
    assert a.device == torch.device("ipu", torch.ipu.current_device())
    assert b.device == torch.device("ipu", 1)
    assert a != torch.Stream("ipu") and a == a


def test_a_stream_runs_the_work_captured_before_it_synchronizes():
    stream = torch.Stream("ipu")
    y = _pending_work()
    assert not stream.query()
    stream.synchronize()
    assert stream.query() and poptorch._C.pending_nodes() == 0
    assert torch.equal(y.cpu(), torch.full((3,), 2.0))


def test_synchronize_raises_what_the_work_raised():
    x = torch.zeros(2, device="ipu")
    x[torch.tensor([5], device="ipu")] = 1.0  # out of range: found when it runs
    with pytest.raises(IndexError, match="out of bounds"):
        torch.Stream("ipu").synchronize()


def test_an_event_records_when_the_work_before_it_has_run():
    start, end = torch.Event("ipu", enable_timing=True), torch.Event("ipu", enable_timing=True)
    assert start.query()  # never recorded: nothing to wait for, as on CUDA
    start.record()
    y = _pending_work()
    end.record(torch.Stream("ipu"))
    assert poptorch._C.pending_nodes() == 0 and end.query()
    assert 0.0 <= start.elapsed_time(end) and end.elapsed_time(end) == 0.0
    end.synchronize()
    end.wait()
    assert end.device == torch.device("ipu", torch.ipu.current_device())
    assert torch.equal(y.cpu(), torch.full((3,), 2.0))


def test_recording_leaves_the_works_error_to_the_next_sync_point():
    x = torch.zeros(2, device="ipu")
    x[torch.tensor([5], device="ipu")] = 1.0
    torch.Event("ipu").record()  # asynchronous, as on CUDA: no error here
    with pytest.raises(IndexError, match="out of bounds"):
        poptorch.synchronize()


def test_elapsed_time_needs_timing_and_two_recorded_events():
    timed, untimed = torch.Event("ipu", enable_timing=True), torch.Event("ipu")
    with pytest.raises(ValueError, match="must be recorded"):
        timed.elapsed_time(torch.Event("ipu", enable_timing=True))
    timed.record()
    untimed.record()
    with pytest.raises(ValueError, match="enable_timing=True"):
        timed.elapsed_time(untimed)


def test_streams_wait_for_events_and_other_streams():
    side, main = torch.Stream("ipu"), torch.Stream("ipu")
    y = _pending_work()
    event = side.record_event()
    assert isinstance(event, torch.Event) and event.query()
    main.wait_event(event)
    main.wait_stream(side)
    event.wait(main)
    assert torch.equal(y.cpu(), torch.full((3,), 2.0))


def test_torch_ipu_streams_and_events_are_the_generic_ones():
    event = torch.ipu.Event(enable_timing=True)
    assert type(event) is torch.Event and isinstance(event, torch.ipu.Event)
    assert not isinstance(torch.Event("cpu"), torch.ipu.Event)
    torch.ipu.current_stream().record_event(event)
    assert event.query() and event.elapsed_time(event) == 0.0
    with pytest.raises(TypeError, match="takes a torch.Event, got str"):
        torch.ipu.current_stream().wait_event("event")
    with pytest.raises(TypeError, match="takes a torch.Stream, got int"):
        torch.ipu.current_stream().wait_stream(3)
