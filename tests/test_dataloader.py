"""poptorch.DataLoader and AsynchronousDataAccessor: combined batches, modes, threads."""
import concurrent.futures
import gc
import logging
import threading
import time

import pytest
import torch
import torch.utils._pytree as pytree
from torch.utils.data import Dataset, IterableDataset, TensorDataset

import poptorch
from poptorch import (AsynchronousDataAccessor, DataLoader, DataLoaderMode, Error, Options,
                      SharingStrategy)
from poptorch._logging import logger


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


def same_batches(got, expected):
    """Batch lists equal leaf for leaf (tensors by value, other leaves by ==)."""
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        leaves_a, spec_a = pytree.tree_flatten(a)
        leaves_b, spec_b = pytree.tree_flatten(b)
        assert spec_a == spec_b
        for x, y in zip(leaves_a, leaves_b):
            assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
    return True


def torch_batches(dataset, batch_size, **kwargs):
    """What torch's DataLoader yields for one combined batch per batch."""
    return list(torch.utils.data.DataLoader(dataset, batch_size=batch_size, **kwargs))


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
    assert same_batches(list(loader), torch_batches(numbered(100), combined, drop_last=True))


def test_replicas_of_one_input_group_share_their_samples():
    opts = options(2, 4)
    opts.inputReplicaGrouping(2, poptorch.CommGroupType.Orthogonal)
    loader = DataLoader(opts, numbered(30), batch_size=3)
    assert loader.combinedBatchSize == 3 * 2 * (4 // 2) and len(loader) == 2
    with pytest.raises(Error, match=r"replicationFactor that is a multiple of 3"):
        DataLoader(options(1, 4).inputReplicaGrouping(3), numbered(30))


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
    with pytest.raises(Error, match="AsyncRebatched needs a batch_size"):
        DataLoader(opts, numbered(8), batch_size=None, mode=DataLoaderMode.AsyncRebatched)
    with pytest.raises(Error, match="cannot set rebatched_size"):
        DataLoader(opts, numbered(8), mode=DataLoaderMode.Async,
                   async_options={"rebatched_size": 2})
    with pytest.raises(ValueError, match="prefetch_factor"):  # torch's own checks still apply
        DataLoader(opts, numbered(8), prefetch_factor=2)


def test_too_small_a_dataset_is_an_error():
    with pytest.raises(Error, match=r"the dataset has 11 samples but one combined batch needs "
                                    r"12 \(batch_size 2 x deviceIterations 3 x "
                                    r"replicationFactor 2 x Training.gradientAccumulation 1\)"):
        DataLoader(options(3, 2), numbered(11), batch_size=2)


def test_drop_last_false_returns_the_incomplete_batch_as_torch_does(log):
    loader = DataLoader(options(2), numbered(25), batch_size=3, drop_last=False)
    assert [len(b) for b in indices(loader)] == [6, 6, 6, 6, 1] and len(loader) == 5
    assert same_batches(list(loader), torch_batches(numbered(25), 6))
    warnings = [r.getMessage() for r in log.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "the last batch will hold 1 samples" in warnings[0]
    small = DataLoader(options(2), numbered(5), batch_size=3, drop_last=False)
    assert indices(small) == [[0, 1, 2, 3, 4]] and len(small) == 1


@pytest.mark.parametrize("n, drop_last", [(25, True), (24, False)])
def test_no_warning_when_nothing_unexpected_is_dropped(log, n, drop_last):
    DataLoader(options(2), numbered(n), batch_size=3, drop_last=drop_last)
    assert not [r for r in log.records if r.levelno >= logging.WARNING]


def seeded(seed=0):
    return torch.Generator().manual_seed(seed)


def keyed(samples):
    """A collate_fn returning a dict and a plain list."""
    return {"x": torch.stack([x for x, _ in samples]), "ids": [int(i) for _, i in samples]}


def seed_worker(worker_id):
    torch.manual_seed(1000 + worker_id)


@pytest.mark.parametrize("make_kwargs", [
    lambda: dict(shuffle=True, generator=seeded(3)),
    lambda: dict(sampler=torch.utils.data.SubsetRandomSampler(range(5, 40), generator=seeded(4))),
    lambda: dict(sampler=torch.utils.data.WeightedRandomSampler([1.0] * 40, 30,
                                                                generator=seeded(5))),
    lambda: dict(collate_fn=keyed),
    lambda: dict(shuffle=True, generator=seeded(6), drop_last=False),
    lambda: dict(num_workers=2, worker_init_fn=seed_worker, prefetch_factor=3),
    lambda: dict(num_workers=2, persistent_workers=False, timeout=30, shuffle=True,
                 generator=seeded(7)),
    lambda: dict(num_workers=1, collate_fn=keyed, drop_last=False, in_order=True),
], ids=["shuffle", "subset-sampler", "weighted-sampler", "collate_fn", "no-drop-last",
        "workers", "workers-not-persistent", "one-worker"])
def test_torch_dataloader_arguments_give_torch_batches(make_kwargs):
    """Each argument does what it does in torch: same batches as torch's
    DataLoader with the combined batch size (fresh generators of one seed)."""
    dataset = numbered(40)
    kwargs = make_kwargs()
    drop_last = kwargs.pop("drop_last", True)
    loader = DataLoader(options(2, 1, 2), dataset, batch_size=3, drop_last=drop_last, **kwargs)
    kwargs = make_kwargs()
    kwargs.pop("drop_last", None)
    reference = torch.utils.data.DataLoader(dataset, batch_size=12, drop_last=drop_last, **kwargs)
    for _ in range(2):  # two epochs: the generators go on
        expected = within(60, lambda: list(reference))
        assert same_batches(within(60, lambda: list(loader)), expected)
        assert len(loader) == len(reference) == len(expected)


def test_pin_memory_is_accepted_and_does_nothing(recwarn):
    loader = DataLoader(options(2), numbered(8), batch_size=2, pin_memory=True,
                        pin_memory_device="ipu")
    assert same_batches(list(loader), torch_batches(numbered(8), 4))
    assert not [w for w in recwarn if "pin_memory" in str(w.message)]


def micro_batch_sampler(n, size, drop_last=False):
    return torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(range(n)), size,
                                         drop_last)


@pytest.mark.parametrize("drop_last", [True, False])
def test_batch_sampler_yields_the_micro_batches(drop_last):
    """Each combined batch holds the samples of 3 consecutive batches of the sampler."""
    sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(
        range(40), generator=seeded(1)), 2, drop_last=True)
    loader = DataLoader(options(3), numbered(40), batch_sampler=sampler, drop_last=drop_last)
    assert loader.combinedBatchSize is None
    sampler.sampler.generator.manual_seed(1)
    micro = list(torch.utils.data.DataLoader(numbered(40), batch_sampler=sampler))
    groups = [micro[i:i + 3] for i in range(0, len(micro), 3)]
    if drop_last:
        groups = [g for g in groups if len(g) == 3]
    expected = [[torch.cat(column) for column in zip(*group)] for group in groups]
    sampler.sampler.generator.manual_seed(1)
    assert same_batches(list(loader), expected)
    assert len(loader) == len(expected) == (6 if drop_last else 7)


def test_batch_sampler_checks():
    with pytest.raises(Error, match="cannot be combined with batch_size"):
        DataLoader(options(), numbered(8), batch_size=2, batch_sampler=micro_batch_sampler(8, 2))
    with pytest.raises(Error, match="cannot be combined with batch_size"):
        DataLoader(options(), numbered(8), shuffle=True, batch_sampler=micro_batch_sampler(8, 2))
    uneven = DataLoader(options(3), numbered(8), batch_sampler=micro_batch_sampler(8, 3))
    with pytest.raises(Error, match=r"micro-batches of \[2, 3\] samples"):
        list(uneven)
    with pytest.raises(Error, match="cannot split a dataset read through your sampler"):
        DataLoader(options_with(0, 2), numbered(8), batch_sampler=micro_batch_sampler(8, 2))


def test_batch_size_none_takes_the_items_as_batches():
    dataset = [torch.full((4, 2), float(i)) for i in range(5)]
    loader = DataLoader(options(2), dataset, batch_size=None)
    assert loader.combinedBatchSize is None and len(loader) == 5
    assert same_batches(list(loader), torch_batches(dataset, None))


class Stream(IterableDataset):
    """0..n-1; with several workers each yields its share."""

    def __init__(self, n, sized=False):
        self.n, self.sized = n, sized

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is None:
            return iter(torch.arange(self.n))
        share = -(-self.n // info.num_workers)
        return iter(torch.arange(info.id * share, min(self.n, (info.id + 1) * share)))

    def __len__(self):
        if not self.sized:
            raise TypeError("no len")
        return self.n


@pytest.mark.parametrize("drop_last", [True, False])
def test_iterable_dataset_as_torch(drop_last):
    loader = DataLoader(options(2), Stream(9), batch_size=2, drop_last=drop_last)
    assert same_batches(list(loader), torch_batches(Stream(9), 4, drop_last=drop_last))
    with pytest.raises(Error, match="auto_distributed_partitioning cannot split"):
        DataLoader(options_with(0, 2), Stream(8))


def test_iterable_dataset_read_by_workers():
    """torch's batches: each worker drops its own short batch (drop_last=True)
    or yields it (drop_last=False), as in PopTorch's Sync mode."""
    kept = DataLoader(options(2), Stream(22), batch_size=2, num_workers=2,
                      worker_init_fn=seed_worker)
    assert same_batches(within(60, lambda: list(kept)),
                        torch_batches(Stream(22), 4, num_workers=2, drop_last=True))
    every = DataLoader(options(2), Stream(22, sized=True), batch_size=2, num_workers=2,
                       drop_last=False, worker_init_fn=seed_worker)
    batches = within(60, lambda: list(every))
    reference = torch_batches(Stream(22), 4, num_workers=2)
    assert [len(b) for b in reference] == [4, 4, 4, 4, 3, 3]
    assert same_batches(batches, reference) and len(every) == 6


def test_iterable_dataset_read_by_workers_without_init_fn_warns(log):
    DataLoader(options(), Stream(8), num_workers=2)
    assert any("each sample is loaded 2 times" in r.getMessage() for r in log.records)


def test_distributed_partitioning_gives_each_process_its_own_share():
    shares = [sum(indices(DataLoader(options_with(p, 3), numbered(40), batch_size=2)), [])
              for p in range(3)]
    assert [len(s) for s in shares] == [12, 12, 12]
    assert len(set().union(*map(set, shares))) == 36, "the shares do not overlap"
    whole = DataLoader(options_with(1, 3), numbered(40), batch_size=2,
                       auto_distributed_partitioning=False)
    assert len(whole) == 10
    with pytest.raises(Error, match="cannot split a dataset read through your sampler"):
        DataLoader(options_with(0, 2), numbered(8), sampler=range(8))


def test_distributed_shares_are_whole_combined_batches():
    """100 samples, combined batches of 4, 3 processes: each share is 8 whole
    batches, one after the other (a share of 33 would drop one sample that
    the next process does not use either)."""
    shares = [sum(indices(DataLoader(options_with(p, 3), numbered(100), batch_size=2)), [])
              for p in range(3)]
    assert shares == [list(range(32 * p, 32 * (p + 1))) for p in range(3)]


@pytest.mark.parametrize("seed", [None, 5])
def test_distributed_shuffled_shares_are_disjoint_cover_and_change_per_epoch(seed):
    """Each process draws the same permutation per epoch and takes its share:
    one epoch's shares are disjoint and cover the dataset, and the next epoch
    deals them differently."""
    def loaders():
        for p in range(3):
            opts = options_with(p, 3)
            if seed is not None:
                opts.randomSeed(seed)
            yield DataLoader(opts, numbered(42), batch_size=1, shuffle=True)

    processes = list(loaders())
    epochs = [[sum(indices(loader), []) for loader in processes] for _ in range(2)]
    for shares in epochs:
        assert [len(s) for s in shares] == [14, 14, 14]
        assert sorted(sum(shares, [])) == list(range(42)), "the shares overlap or miss some"
        assert sum(shares, []) != list(range(42)), "not shuffled"
    assert epochs[0] != epochs[1], "every epoch dealt the same shares"
    again = [sum(indices(loader), []) for loader in loaders()]
    assert again == epochs[0], "another run of the processes dealt other shares"


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
    assert len(other) == len(sync) == (4 if drop_last else 5)
    for _ in range(2):  # two epochs
        expected, got = list(sync), within(30, lambda: list(other))
        assert len(expected) == len(sync)
        assert same_batches(got, expected)
    other.terminate()


def test_async_rebatched_workers_of_an_iterable_dataset_drop_only_the_end():
    loader = DataLoader(options(2), Stream(22, sized=True), batch_size=2, num_workers=2,
                        worker_init_fn=seed_worker, mode=DataLoaderMode.AsyncRebatched,
                        rebatched_worker_size=3)
    batches = within(60, lambda: list(loader))
    assert [len(b) for b in batches] == [4] * 5 and len(loader) == 5
    loaded = torch.cat(torch_batches(Stream(22), 3, num_workers=2))
    assert len(loaded) == 22 and torch.equal(torch.cat(batches), loaded[:20])
    loader.terminate()


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
    loader.terminate()


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


def test_the_accessor_loads_its_first_batch_when_created(log):
    """As PopTorch's: the first batch only (without early_preload), and a
    dataset that cannot load it fails at once, with its error logged."""
    dataset = Counting(6)
    accessor = AsynchronousDataAccessor(torch.utils.data.DataLoader(dataset, batch_size=2))
    time.sleep(0.2)
    assert dataset.loaded == 2, "the first batch, and no more before iterating"
    assert within(30, lambda: [b.flatten().tolist() for b in accessor]) == [[0, 1], [2, 3], [4, 5]]
    accessor.terminate()
    with pytest.raises(Error, match="worker thread failed to start.*sample 0 is corrupt"):
        AsynchronousDataAccessor(torch.utils.data.DataLoader(Counting(6, fail_at=0)))
    assert any("KeyError: 'sample 0 is corrupt'" in r.getMessage() for r in log.records)


def test_a_loader_iterated_beside_its_accessor():
    """The accessor loads through its own copy of the loader (PopTorch's has
    one in its worker process): iterating the loader directly meanwhile
    reset the iterator the accessor's thread was in."""
    loader = DataLoader(options(), numbered(12), batch_size=2, num_workers=2)
    accessor = AsynchronousDataAccessor(loader)
    expected = [[i, i + 1] for i in range(0, 12, 2)]
    assert within(60, lambda: indices(accessor)) == expected
    assert within(60, lambda: indices(loader)) == expected
    assert within(60, lambda: indices(accessor)) == expected
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
