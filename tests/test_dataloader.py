"""poptorch.DataLoader and AsynchronousDataAccessor: combined batches, modes, threads."""
import concurrent.futures
import gc
import logging
import threading
import time

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset

from poptorch._dataloader import (AsynchronousDataAccessor, DataLoader, DataLoaderMode,
                                  SharingStrategy)
from poptorch._errors import Error
from poptorch._logging import logger
from poptorch.options import Options


@pytest.fixture
def log(caplog, monkeypatch):
    """Records of the "poptorch" logger (which does not propagate by default)."""
    monkeypatch.setattr(logger, "propagate", True)
    caplog.set_level(logging.INFO, logger="poptorch")
    return caplog


def numbered(n):
    """Samples (features, index): the index tells which sample a batch holds."""
    return TensorDataset(torch.arange(n, dtype=torch.float32).unsqueeze(1) * 10, torch.arange(n))


def options(device_iterations=1, replication_factor=1, gradient_accumulation=1):
    opts = Options().deviceIterations(device_iterations).replicationFactor(replication_factor)
    opts.Training.gradientAccumulation(gradient_accumulation)
    return opts


def options_with(process_id, num_processes):
    opts = options(2)
    opts.Distributed.configureProcessId(process_id, num_processes)
    return opts


def indices(loader):
    return [batch[1].tolist() for batch in loader]


def within(seconds, fn):
    """fn() run on a helper thread; fails instead of hanging the test suite."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result(timeout=seconds)


class Counting(Dataset):
    """Counts the samples it loaded; raises at index `fail_at`."""

    def __init__(self, n, fail_at=None):
        self.n, self.fail_at, self.loaded = n, fail_at, 0

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        if index == self.fail_at:
            raise KeyError(f"sample {index} is corrupt")
        self.loaded += 1
        return torch.tensor([index])


@pytest.mark.parametrize("batch_size, device_iterations, replicas, accumulation", [
    (1, 1, 1, 1), (4, 1, 1, 1), (2, 3, 1, 1), (2, 1, 2, 1), (1, 1, 1, 5), (2, 3, 2, 2),
])
def test_batches_hold_one_combined_batch(batch_size, device_iterations, replicas, accumulation):
    combined = batch_size * device_iterations * replicas * accumulation
    loader = DataLoader(options(device_iterations, replicas, accumulation), numbered(100),
                        batch_size=batch_size)
    assert loader.combinedBatchSize == combined and loader.batch_size == combined
    batches = indices(loader)
    assert len(loader) == len(batches) == 100 // combined
    assert all(len(batch) == combined for batch in batches)
    assert sum(batches, []) == list(range(len(batches) * combined)), "in order, none skipped"


def test_options_property_and_argument_checks():
    opts = options()
    assert DataLoader(opts, numbered(4)).options is opts
    with pytest.raises(Error, match="takes a poptorch.Options first"):
        DataLoader(numbered(4), numbered(4))
    with pytest.raises(Error, match="batch_size must be a positive integer"):
        DataLoader(opts, numbered(4), batch_size=0)
    with pytest.raises(Error, match="mode must be a poptorch.DataLoaderMode"):
        DataLoader(opts, numbered(4), mode="async")
    with pytest.raises(Error, match="rebatched_worker_size must be an integer from 1 to .* 4"):
        DataLoader(opts, numbered(8), batch_size=4, mode=DataLoaderMode.AsyncRebatched,
                   rebatched_worker_size=5)


def test_too_small_a_dataset_is_an_error():
    with pytest.raises(Error, match=r"the dataset has 11 samples but one combined batch needs "
                                    r"12 \(batch_size 2 x deviceIterations 3 x "
                                    r"replicationFactor 2 x Training.gradientAccumulation 1\)"):
        DataLoader(options(3, 2), numbered(11), batch_size=2)


def test_shuffle_is_deterministic_with_a_seeded_generator():
    def epoch(seed):
        return indices(DataLoader(options(2), numbered(40), batch_size=5, shuffle=True,
                                  generator=torch.Generator().manual_seed(seed)))
    first = epoch(0)
    assert first == epoch(0)
    assert first != epoch(1)
    assert first != indices(DataLoader(options(2), numbered(40), batch_size=5))
    assert sorted(sum(first, [])) == list(range(40))


def test_drop_last_false_warns_and_drops_the_incomplete_batch(log):
    loader = DataLoader(options(2), numbered(25), batch_size=3, drop_last=False)
    assert [len(b) for b in indices(loader)] == [6, 6, 6, 6] and len(loader) == 4
    warnings = [r for r in log.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "the last 1 samples will be dropped" in warnings[0].getMessage()


@pytest.mark.parametrize("n, drop_last", [(25, True), (24, False)])
def test_no_warning_when_nothing_unexpected_is_dropped(log, n, drop_last):
    DataLoader(options(2), numbered(n), batch_size=3, drop_last=drop_last)
    assert not [r for r in log.records if r.levelno >= logging.WARNING]


class Stream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(torch.arange(self.n))


def test_iterable_dataset():
    loader = DataLoader(options(2), Stream(9), batch_size=2, drop_last=False)
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(Error, match="auto_distributed_partitioning cannot split"):
        DataLoader(options_with(0, 2), Stream(8))


def test_distributed_partitioning_gives_each_process_its_own_share():
    shares = [sum(indices(DataLoader(options_with(p, 3), numbered(40), batch_size=2)), [])
              for p in range(3)]
    assert [len(s) for s in shares] == [12, 12, 12]
    assert len(set().union(*map(set, shares))) == 36, "the shares do not overlap"
    whole = DataLoader(options_with(1, 3), numbered(40), batch_size=2,
                       auto_distributed_partitioning=False)
    assert len(whole) == 10


@pytest.mark.parametrize("mode, worker_size", [
    (DataLoaderMode.Async, None), (DataLoaderMode.AsyncRebatched, None),
    (DataLoaderMode.AsyncRebatched, 1), (DataLoaderMode.AsyncRebatched, 4),
    (DataLoaderMode.AsyncRebatched, 5),
])
@pytest.mark.parametrize("drop_last", [True, False])
def test_async_modes_yield_the_sync_batches(mode, worker_size, drop_last):
    def loader(loader_mode):
        return DataLoader(options(2, 1, 3), numbered(51), batch_size=2, shuffle=True,
                          drop_last=drop_last, generator=torch.Generator().manual_seed(3),
                          mode=loader_mode, rebatched_worker_size=worker_size)
    sync, other = loader(DataLoaderMode.Sync), loader(mode)
    assert len(other) == len(sync) == 4
    for _ in range(2):  # two epochs
        expected, got = list(sync), within(30, lambda: list(other))
        assert len(got) == len(expected) == 4
        for (x, i), (y, j) in zip(expected, got):
            assert torch.equal(x, y) and torch.equal(i, j)
    other.terminate()


class Records(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, index):
        return {"x": torch.full((2,), float(index)), "label": index}


def test_rebatching_keeps_the_structure_of_batches():
    loader = DataLoader(options(3), Records(), batch_size=1, mode=DataLoaderMode.AsyncRebatched,
                        rebatched_worker_size=2)
    batches = within(30, lambda: list(loader))
    assert [b["label"].tolist() for b in batches] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert batches[1]["x"].shape == (3, 2) and batches[1]["x"][0].tolist() == [3.0, 3.0]


# --- AsynchronousDataAccessor -----------------------------------------------

def test_accessor_yields_the_loader_batches_every_epoch():
    source = torch.utils.data.DataLoader(numbered(10), batch_size=3)
    for indefinitely in (True, False):
        accessor = AsynchronousDataAccessor(source, load_indefinitely=indefinitely)
        assert len(accessor) == 4
        for _ in range(20):
            assert within(30, lambda: indices(accessor)) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
        accessor.terminate()


def test_early_preload_loads_the_first_epoch_once():
    dataset = Counting(6)
    accessor = AsynchronousDataAccessor(torch.utils.data.DataLoader(dataset, batch_size=2),
                                        early_preload=True, load_indefinitely=False)
    deadline = time.monotonic() + 5
    while dataset.loaded < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert dataset.loaded == 6, "preloaded before any iteration"
    assert within(30, lambda: [b.flatten().tolist() for b in accessor]) == [[0, 1], [2, 3], [4, 5]]
    assert dataset.loaded == 6, "the preloaded epoch is the one consumed"
    accessor.terminate()


def test_worker_processes_and_async_mode():
    def loader(mode):
        return DataLoader(options(2), numbered(40), batch_size=2, num_workers=2, mode=mode)
    sync, asynchronous = loader(DataLoaderMode.Sync), loader(DataLoaderMode.Async)
    assert sync.persistent_workers
    assert indices(sync) == within(60, lambda: indices(asynchronous)) == \
        [list(range(i, i + 4)) for i in range(0, 40, 4)]
    asynchronous.terminate()


def test_an_abandoned_epoch_restarts_from_the_beginning():
    accessor = AsynchronousDataAccessor(torch.utils.data.DataLoader(numbered(10), batch_size=2))
    epoch = iter(accessor)
    assert next(epoch)[1].tolist() == [0, 1]
    assert within(30, lambda: indices(accessor)) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    accessor.terminate()


def test_rebatching_accessor():
    source = torch.utils.data.DataLoader(numbered(11), batch_size=3)
    accessor = AsynchronousDataAccessor(source, rebatched_size=4)
    assert len(accessor) == 2
    assert within(30, lambda: indices(accessor)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(Error, match="cannot rebatch a batch holding a str"):
        within(30, lambda: list(AsynchronousDataAccessor([["a"], ["b"]], rebatched_size=2)))


def test_accessor_argument_checks():
    with pytest.raises(Error, match="buffer_size must be a positive integer"):
        AsynchronousDataAccessor([], buffer_size=0)
    with pytest.raises(Error, match="rebatched_size must be a positive integer"):
        AsynchronousDataAccessor([], rebatched_size=-1)
    with pytest.raises(Error, match="sharing_strategy"):
        AsynchronousDataAccessor([], sharing_strategy="fork")
    accessor = AsynchronousDataAccessor([1, 2], sharing_strategy=SharingStrategy.SharedMemory)
    assert within(30, lambda: list(accessor)) == [1, 2]
    accessor.terminate()


def test_a_loading_error_reaches_the_consumer():
    dataset = Counting(10, fail_at=5)
    accessor = AsynchronousDataAccessor(torch.utils.data.DataLoader(dataset, batch_size=1))
    received = []

    def consume():
        with pytest.raises(KeyError, match="sample 5 is corrupt"):
            for batch in accessor:
                received.append(batch.item())
    within(30, consume)
    assert received == [0, 1, 2, 3, 4]
    within(30, consume)  # a new epoch starts over and meets the same error
    assert received == [0, 1, 2, 3, 4] * 2
    accessor.terminate()


def test_a_loading_error_reaches_the_async_data_loader_consumer():
    loader = DataLoader(options(), Counting(10, fail_at=5), mode=DataLoaderMode.Async)
    with pytest.raises(KeyError, match="sample 5 is corrupt"):
        within(30, lambda: list(loader))


def test_loading_stays_within_the_buffer():
    dataset = Counting(100)
    accessor = AsynchronousDataAccessor(torch.utils.data.DataLoader(dataset, batch_size=2),
                                        buffer_size=2, early_preload=True)
    deadline = time.monotonic() + 5
    while dataset.loaded < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert 4 <= dataset.loaded <= 6, "2 queued batches and 1 in flight at most"
    accessor.terminate()


def test_terminate_stops_the_thread_and_ends_the_epoch():
    accessor = AsynchronousDataAccessor(torch.utils.data.DataLoader(numbered(50), batch_size=1))
    epoch = iter(accessor)
    next(epoch)
    thread = accessor._thread
    assert thread.is_alive()
    accessor.terminate()
    assert not thread.is_alive()
    assert list(epoch) == [], "a terminated epoch yields nothing more"
    assert within(30, lambda: len(indices(accessor))) == 50, "iterating again restarts"
    accessor.terminate()


def test_collecting_the_accessor_stops_its_thread():
    accessor = AsynchronousDataAccessor(torch.utils.data.DataLoader(numbered(50), batch_size=1),
                                        early_preload=True)
    thread = accessor._thread
    assert thread.is_alive()
    del accessor
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


def test_collecting_an_async_data_loader_stops_its_thread():
    loader = DataLoader(options(), numbered(50), mode=DataLoaderMode.Async)
    epoch = iter(loader)
    next(epoch)
    names = [t for t in threading.enumerate() if t.name == "poptorch-data-loader"]
    assert names
    del loader, epoch
    gc.collect()
    for thread in names:
        thread.join(5)
        assert not thread.is_alive()
