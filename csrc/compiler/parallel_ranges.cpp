#include "compiler/parallel_ranges.h"

#include <algorithm>
#include <functional>
#include <vector>

#include "common/logging.h"
#include "compiler/executable.h"
#include "compiler/node_cost.h"

namespace poptorch::compiler {
namespace {

// Starting a range on two threads wakes the second one from its condition
// variable and joins it at the end; the threads then go back to kernels on
// both cores. (Wake-ups on this machine take 5-20 us.)
constexpr double kRangeUs = 20.0;
// Per node of a range: taking it from the shared ready list and announcing
// its end, on either thread (cache lines moving between the cores).
constexpr double kHandOffUs = 2.0;
// The estimate of a range on two threads is trusted to 15%: where two threads
// gain less than that, program order is kept.
constexpr double kTwoThreadMargin = 1.15;
// Two kernels at once share the memory bandwidth and the L3 cache.
constexpr double kSharedCoresSlowdown = 1.1;
// The longest range considered: the choice costs O(nodes * kMaxRange^2).
constexpr int32_t kMaxRange = 48;

// The time nodes [begin, end) take on two threads, each thread taking the
// ready node of lowest index whenever it is free, as
// runtime::runSegmentOnTwoThreads does. Nodes before `begin` have finished.
class TwoThreadSchedule {
 public:
  TwoThreadSchedule(const NodeDependencies& deps, const std::vector<double>& one_core_us)
      : deps_(deps), one_core_us_(one_core_us) {}

  double makespan(int32_t begin, int32_t end) {
    const auto count = static_cast<size_t>(end - begin);
    waiting_.assign(count, 0);
    for (int32_t i = begin; i < end; ++i) {
      for (int32_t s : deps_.successors[i]) {
        if (s < end) ++waiting_[s - begin];
      }
    }
    ready_.clear();
    for (int32_t i = begin; i < end; ++i) {
      if (waiting_[i - begin] == 0) ready_.push_back(i);
    }
    std::make_heap(ready_.begin(), ready_.end(), std::greater<>());
    struct Running {
      double finish;
      int32_t node;
    };
    Running running[2];
    int busy = 0;
    double now = 0;
    for (size_t done = 0; done < count; ++done) {
      while (busy < 2 && !ready_.empty()) {
        std::pop_heap(ready_.begin(), ready_.end(), std::greater<>());
        const int32_t node = ready_.back();
        ready_.pop_back();
        running[busy++] = {now + one_core_us_[node] * kSharedCoresSlowdown + kHandOffUs, node};
      }
      const int first = busy == 2 && running[1].finish < running[0].finish ? 1 : 0;
      now = running[first].finish;
      const int32_t node = running[first].node;
      running[first] = running[--busy];
      for (int32_t s : deps_.successors[node]) {
        if (s < end && --waiting_[s - begin] == 0) {
          ready_.push_back(s);
          std::push_heap(ready_.begin(), ready_.end(), std::greater<>());
        }
      }
    }
    return now;
  }

 private:
  const NodeDependencies& deps_;
  const std::vector<double>& one_core_us_;
  std::vector<int32_t> waiting_;
  std::vector<int32_t> ready_;  // a min-heap of node indices
};

// The fastest way to run `segment` as a sequence of ranges, each run in
// program order or on two threads (dynamic programming over where the
// ranges end); appends its two-thread ranges to `ranges`.
void chooseInSegment(NodeDependencies::Segment segment, const std::vector<double>& one_core_us,
                     const std::vector<double>& two_cores_us, TwoThreadSchedule& schedule,
                     std::vector<NodeDependencies::Segment>& ranges) {
  const int32_t length = segment.end - segment.begin;
  // best[j]: the time of the segment's first j nodes; from[j]: where the range
  // ending at j begins when it runs on two threads, else -1.
  std::vector<double> best(static_cast<size_t>(length) + 1, 0.0);
  std::vector<int32_t> from(static_cast<size_t>(length) + 1, -1);
  std::vector<double> one_core_sum(static_cast<size_t>(length) + 1, 0.0);
  for (int32_t j = 1; j <= length; ++j) {
    one_core_sum[j] = one_core_sum[j - 1] + one_core_us[segment.begin + j - 1];
    best[j] = best[j - 1] + two_cores_us[segment.begin + j - 1];
    for (int32_t i = std::max(0, j - kMaxRange); i <= j - 2; ++i) {
      // Two threads take at least half the work: skip what cannot win.
      const double bound =
          best[i] + kRangeUs + kTwoThreadMargin * (one_core_sum[j] - one_core_sum[i]) / 2;
      if (bound >= best[j]) continue;
      const double t = best[i] + kRangeUs +
                       kTwoThreadMargin * schedule.makespan(segment.begin + i, segment.begin + j);
      if (t < best[j]) {
        best[j] = t;
        from[j] = i;
      }
    }
  }
  if (logging::enabled(logging::Level::kDebug)) {
    double in_order = 0;
    for (int32_t i = segment.begin; i < segment.end; ++i) in_order += two_cores_us[i];
    POPTORCH_LOG(kDebug) << "inter-op: nodes " << segment.begin << "-" << segment.end - 1
                         << " estimated " << best[length] << " us against " << in_order
                         << " us in program order";
  }
  const size_t first = ranges.size();
  for (int32_t j = length; j > 0;) {
    if (from[j] < 0) {
      --j;
      continue;
    }
    ranges.push_back({segment.begin + from[j], segment.begin + j});
    j = from[j];
  }
  std::reverse(ranges.begin() + static_cast<std::ptrdiff_t>(first), ranges.end());
}

}  // namespace

std::vector<NodeDependencies::Segment> chooseParallelRanges(const Executable& exe,
                                                            const NodeDependencies& deps) {
  std::vector<NodeDependencies::Segment> ranges;
  if (!deps.parallel()) return ranges;
  const size_t n = exe.program.nodes.size();
  std::vector<double> one_core_us(n);
  std::vector<double> two_cores_us(n);
  for (size_t i = 0; i < n; ++i) {
    const NodeCost cost = estimateNodeCost(exe.program.nodes[i]);
    one_core_us[i] = cost.one_core_us;
    two_cores_us[i] = cost.two_cores_us;
    POPTORCH_LOG(kTrace) << "inter-op: node " << i << " " << exe.program.nodes[i].name()
                         << " estimated " << cost.one_core_us << " us on one core, "
                         << cost.two_cores_us << " on two";
  }
  TwoThreadSchedule schedule(deps, one_core_us);
  for (const NodeDependencies::Segment& segment : deps.segments) {
    if (segment.end - segment.begin < 2) continue;
    chooseInSegment(segment, one_core_us, two_cores_us, schedule, ranges);
  }
  if (logging::enabled(logging::Level::kDebug)) {
    std::ostringstream chosen;
    for (const NodeDependencies::Segment& r : ranges) chosen << " " << r.begin << "-" << r.end - 1;
    POPTORCH_LOG(kDebug) << "inter-op: " << n << " nodes, on two threads:" << chosen.str();
  }
  return ranges;
}

}  // namespace poptorch::compiler
