// Which node reads each buffer, when only one does, and which buffers some
// node writes in place: what a fusion asks of a temporary it folds away.
#pragma once

#include <vector>

#include "ir/graph.h"

namespace poptorch::passes {

class SoleReaders {
 public:
  explicit SoleReaders(const ir::Graph& graph)
      : reader_(graph.buffers.size(), -1), written_(graph.buffers.size(), false) {
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      const auto index = static_cast<int32_t>(i);
      for (const ir::TensorRef& in : graph.nodes[i].inputs) {
        int32_t& r = reader_[in.buffer];
        r = (r == -1 || r == index) ? index : -2;
      }
      for (ir::BufferId w : graph.nodes[i].writes) written_[w] = true;
    }
  }

  // The one node that reads `buffer`: -1 if none does, -2 if several do.
  int32_t soleReader(ir::BufferId buffer) const { return reader_[buffer]; }
  // Whether a node writes `buffer` in place.
  bool written(ir::BufferId buffer) const { return written_[buffer]; }

 private:
  std::vector<int32_t> reader_;
  std::vector<bool> written_;
};

}  // namespace poptorch::passes
