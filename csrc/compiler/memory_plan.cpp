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

// Walks the program as the runtime will, given exe.release_after: a temporary
// takes its place at its first use (`place(i, b)`), every node runs once its
// temporaries are placed (`ran(i)`), and a temporary gives its place back
// after its last use (`release(i, b)`).
template <typename Place, typename Ran, typename Release>
void walkTemporaries(const Executable& exe, Place&& place, Ran&& ran, Release&& release) {
  std::vector<bool> placed(exe.program.buffers.size(), false);
  for (size_t i = 0; i < exe.program.nodes.size(); ++i) {
    forEachBuffer(exe.program.nodes[i], [&](ir::BufferId b) {
      if (!isTemporary(exe, b) || placed[b]) return;
      placed[b] = true;
      place(i, b);
    });
    ran(i);
    for (ir::BufferId b : exe.release_after[i]) release(i, b);
  }
}

// Bytes of temporaries per ipu index, as a walk places and releases them. A
// temporary counts on the IPU of the block whose node makes it in a model
// split over IPUs, else on its buffer's device.
class LiveBytes {
 public:
  explicit LiveBytes(const Executable& exe) : exe_(exe), ipu_of_(exe.program.buffers.size(), 0) {}
  void place(const ir::Node& node, ir::BufferId b) {
    ipu_of_[b] = static_cast<size_t>(ipuOfUse(exe_.program, node, b));
    add(b, +1);
  }
  void release(ir::BufferId b) { add(b, -1); }
  const std::vector<int64_t>& bytes() const { return bytes_; }

 private:
  void add(ir::BufferId b, int64_t sign) {
    if (bytes_.size() <= ipu_of_[b]) bytes_.resize(ipu_of_[b] + 1, 0);
    bytes_[ipu_of_[b]] += sign * exe_.program.buffers[b].nbytes;
  }

  const Executable& exe_;
  std::vector<size_t> ipu_of_;
  std::vector<int64_t> bytes_;
};

}  // namespace

bool isTemporary(const Executable& exe, ir::BufferId b) {
  return exe.roles[b] == BufferRole::kProduced || exe.roles[b] == BufferRole::kScratch;
}

int32_t ipuOfUse(const ir::Graph& program, const ir::Node& node, ir::BufferId b) {
  return node.placement == ir::Placement{} ? std::max<int32_t>(0, program.buffers[b].device.index())
                                           : node.placement.ipu;
}

std::vector<std::vector<int64_t>> temporaryBytesByNode(const Executable& exe) {
  std::vector<std::vector<int64_t>> by_node(exe.program.nodes.size());
  LiveBytes live(exe);
  walkTemporaries(
      exe, [&](size_t i, ir::BufferId b) { live.place(exe.program.nodes[i], b); },
      [&](size_t i) { by_node[i] = live.bytes(); },
      [&](size_t, ir::BufferId b) { live.release(b); });
  return by_node;
}

void planMemory(Executable& exe) {
  const ir::Graph& program = exe.program;
  const size_t num_buffers = program.buffers.size();

  std::vector<int32_t> last_use(num_buffers, -1);
  for (size_t i = 0; i < program.nodes.size(); ++i) {
    forEachBuffer(program.nodes[i], [&](ir::BufferId b) { last_use[b] = static_cast<int32_t>(i); });
  }
  exe.release_after.assign(program.nodes.size(), {});
  for (size_t b = 0; b < num_buffers; ++b) {
    const auto id = static_cast<ir::BufferId>(b);
    if (isTemporary(exe, id) && last_use[b] >= 0) exe.release_after[last_use[b]].push_back(id);
  }

  // The arena is host memory; the peak per ipu models what the temporaries
  // would take on each IPU (see LiveBytes).
  OffsetAllocator arena;
  exe.arena_offset.assign(num_buffers, -1);
  exe.peak_temporary_bytes.clear();
  LiveBytes live(exe);
  walkTemporaries(
      exe,
      [&](size_t i, ir::BufferId b) {
        exe.arena_offset[b] = arena.allocate(program.buffers[b].nbytes);
        live.place(program.nodes[i], b);
      },
      [&](size_t) {
        const std::vector<int64_t>& bytes = live.bytes();
        if (exe.peak_temporary_bytes.size() < bytes.size()) {
          exe.peak_temporary_bytes.resize(bytes.size(), 0);
        }
        for (size_t d = 0; d < bytes.size(); ++d) {
          exe.peak_temporary_bytes[d] = std::max(exe.peak_temporary_bytes[d], bytes[d]);
        }
      },
      [&](size_t, ir::BufferId b) {
        arena.release(exe.arena_offset[b], program.buffers[b].nbytes);
        live.release(b);
      });
  exe.arena_bytes = arena.size();
}

}  // namespace poptorch::compiler
