#include "runtime/update_variants.h"

#include <c10/util/Exception.h>

#include <utility>

namespace poptorch::runtime {

UpdateVariants::UpdateVariants(std::shared_ptr<Program> first, Choose choose,
                               bool choose_every_time)
    : choose_(std::move(choose)), choose_every_time_(choose_every_time) {
  chosen_.emplace(std::vector<size_t>{0}, std::move(first));
}

const Program& UpdateVariants::forVariants(const std::vector<size_t>& ran) {
  if (!choose_every_time_) {
    auto found = chosen_.find(ran);
    if (found != chosen_.end()) return *found->second;
  }
  std::shared_ptr<Program> program = choose_(ran);
  TORCH_CHECK(program != nullptr, "internal: no update program for an iteration");
  if (choose_every_time_) {
    last_ = std::move(program);
    return *last_;
  }
  return *chosen_.emplace(ran, std::move(program)).first->second;
}

}  // namespace poptorch::runtime
