// Inter-op parallelism: the independent nodes of a program (see
// compiler::NodeDependencies) run on two cores at once, each kernel on one
// thread, where a kernel alone would fork its own threads. Every node runs the
// same kernel on the same data as in program order, so the values are the same.
#pragma once

#include <functional>

#include "compiler/node_dependencies.h"

namespace poptorch::runtime {

// True when this thread may run a segment on two threads: at least two
// threads are allowed (torch.get_num_threads()) and it is not already one of
// an OpenMP team (an inference lane, a kernel's worker).
bool interOpAvailable();

// Runs the nodes of `segment` on two threads (the calling thread and one that
// persists between segments), each kernel on one thread, each node once
// the nodes of the segment it waits for have returned, the earliest ready node
// first. `run_node(i)` runs node i on either thread under the calling thread's
// thread-local state, with the thread's number (0 for the calling thread, 1);
// it returns false when the node failed, and then, with
// `stop_on_failure`, no node starts after it. Returns when every node that
// started has returned; an exception from `run_node` is raised then. When the
// second thread is busy with another caller, the calling thread runs them all.
void runSegmentOnTwoThreads(const compiler::NodeDependencies& deps,
                            compiler::NodeDependencies::Segment segment, bool stop_on_failure,
                            const std::function<bool(size_t, int)>& run_node);

}  // namespace poptorch::runtime
