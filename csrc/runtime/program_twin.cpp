#include "runtime/program_twin.h"

#include <algorithm>
#include <utility>

#include "device/ipu_device.h"
#include "device/ipu_tensor.h"

namespace poptorch::runtime {

ProgramTwin twinWithOwnIo(const Program& program, const std::vector<at::Tensor>& inputs,
                          const std::vector<at::Tensor>& outputs) {
  std::vector<std::pair<c10::Storage, c10::Storage>> replace;
  ProgramTwin twin;
  // One storage of the twin's own per storage of the original (an output
  // may be an input, or a view of one).
  auto fresh = [&](const at::Tensor& t) {
    auto same = std::find_if(replace.begin(), replace.end(),
                             [&](const auto& pair) { return t.storage().is_alias_of(pair.first); });
    if (same == replace.end()) {
      const auto nbytes = static_cast<int64_t>(t.storage().nbytes());
      at::Tensor bytes =
          device::emptyIpuTensor({nbytes}, {1}, c10::ScalarType::Byte, t.device().index());
      device::materialize(*bytes.storage().unsafeGetStorageImpl());
      same = replace.emplace(replace.end(), t.storage(), bytes.storage());
    }
    return device::ipuView(same->second, t.sizes(), t.strides(), t.storage_offset(),
                           t.scalar_type());
  };
  for (const at::Tensor& t : inputs) twin.inputs.push_back(fresh(t));
  for (const at::Tensor& t : outputs) twin.outputs.push_back(fresh(t));
  twin.program = program.twin(replace);
  return twin;
}

}  // namespace poptorch::runtime
