// The emulated IPUs' queue of work, as PyTorch's streams and events see it
// (device/guard.cpp): captured ops wait in the pending graph, then run in
// order on the device queue (runtime::Worker). Every IPU has that one queue.
#pragma once

namespace poptorch::capture {

// Runs the pending graph (poptorch.synchronize()), and raises the first error
// of the graphs run since the previous sync point (the op that raised it
// named); the tensors computed from a failed op stay poisoned.
void synchronize();

// Runs every pending op and waits for the queue to empty. An error of that
// work is not raised here: it stays for the next sync point (synchronize(),
// or a read of a tensor it poisoned), as an asynchronous device error does.
void runPendingWork();

// True when no captured op waits to run or is running.
bool queueIsIdle();

}  // namespace poptorch::capture
