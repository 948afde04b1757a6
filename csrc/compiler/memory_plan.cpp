#include "compiler/memory_plan.h"

#include <algorithm>
#include <map>

namespace poptorch::compiler {
namespace {

// Kernels vectorise best on cache-line-aligned data, as the CPU allocator gives it.
constexpr int64_t kAlignment = 64;

// The bytes a temporary takes in the arena: whole alignment units, at least one.
int64_t placeSize(int64_t nbytes) {
  return std::max<int64_t>(kAlignment, (nbytes + kAlignment - 1) / kAlignment * kAlignment);
}

// Offsets in an arena, handed out as a best-fit allocator would at run time.
class OffsetAllocator {
 public:
  int64_t allocate(int64_t nbytes) {
    nbytes = placeSize(nbytes);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second >= nbytes && (best == free_.end() || it->second < best->second)) best = it;
    }
    if (best == free_.end() && !free_.empty()) {
      // Grow the arena from the free block at its end, if there is one.
      auto last = std::prev(free_.end());
      if (last->first + last->second == end_) {
        end_ += nbytes - last->second;
        last->second = nbytes;
        best = last;
      }
    }
    if (best == free_.end()) {
      const int64_t offset = end_;
      end_ += nbytes;
      return offset;
    }
    const auto [offset, size] = *best;
    free_.erase(best);
    if (size > nbytes) free_.emplace(offset + nbytes, size - nbytes);
    return offset;
  }

  void release(int64_t offset, int64_t nbytes) {
    nbytes = placeSize(nbytes);
    auto it = free_.emplace(offset, nbytes).first;
    if (auto next = std::next(it); next != free_.end() && offset + nbytes == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
      }
    }
  }

  int64_t size() const { return end_; }

 private:
  std::map<int64_t, int64_t> free_;  // offset -> bytes
  int64_t end_ = 0;
};

}  // namespace

void planMemory(Executable& exe) {
  const ir::Graph& program = exe.program;
  const size_t num_buffers = program.buffers.size();
  auto temporary = [&](ir::BufferId b) {
    return exe.roles[b] == BufferRole::kProduced || exe.roles[b] == BufferRole::kScratch;
  };
  auto forEachBuffer = [](const ir::Node& node, auto&& visit) {
    for (const ir::TensorRef& in : node.inputs) visit(in.buffer);
    for (ir::BufferId w : node.writes) visit(w);
    for (const ir::TensorRef& out : node.outputs) visit(out.buffer);
  };

  std::vector<int32_t> last_use(num_buffers, -1);
  for (size_t i = 0; i < program.nodes.size(); ++i) {
    forEachBuffer(program.nodes[i], [&](ir::BufferId b) { last_use[b] = static_cast<int32_t>(i); });
  }
  exe.release_after.assign(program.nodes.size(), {});
  for (size_t b = 0; b < num_buffers; ++b) {
    const auto id = static_cast<ir::BufferId>(b);
    if (temporary(id) && last_use[b] >= 0) exe.release_after[last_use[b]].push_back(id);
  }

  // Walk the program as the runtime will: a temporary takes its place at its
  // first use and gives it back after its last. The arena is host memory;
  // the peak per ipu models what the temporaries would take on each IPU: the
  // IPU of the block whose node makes them in a model split over IPUs, else
  // the device of the buffer.
  OffsetAllocator arena;
  exe.arena_offset.assign(num_buffers, -1);
  exe.peak_temporary_bytes.clear();
  std::vector<int64_t> current;
  std::vector<size_t> ipu_of(num_buffers, 0);
  auto account = [&](ir::BufferId b, int64_t sign) {
    const size_t ipu = ipu_of[b];
    if (current.size() <= ipu) current.resize(ipu + 1, 0);
    if (exe.peak_temporary_bytes.size() <= ipu) exe.peak_temporary_bytes.resize(ipu + 1, 0);
    current[ipu] += sign * program.buffers[b].nbytes;
    exe.peak_temporary_bytes[ipu] = std::max(exe.peak_temporary_bytes[ipu], current[ipu]);
  };
  for (size_t i = 0; i < program.nodes.size(); ++i) {
    const ir::Node& node = program.nodes[i];
    forEachBuffer(node, [&](ir::BufferId b) {
      if (!temporary(b) || exe.arena_offset[b] >= 0) return;
      exe.arena_offset[b] = arena.allocate(program.buffers[b].nbytes);
      ipu_of[b] = static_cast<size_t>(node.placement == ir::Placement{}
                                          ? std::max<int>(0, program.buffers[b].device.index())
                                          : node.placement.ipu);
      account(b, +1);
    });
    for (ir::BufferId b : exe.release_after[i]) {
      arena.release(exe.arena_offset[b], program.buffers[b].nbytes);
      account(b, -1);
    }
  }
  exe.arena_bytes = arena.size();
}

}  // namespace poptorch::compiler
