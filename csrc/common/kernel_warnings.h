// The warnings kernels give (TORCH_WARN), which PyTorch passes to the calling
// thread's c10::WarningHandler: Python's bindings turn them into Python
// warnings when the call returns. Capture gives the user the CPU kernel's
// warnings at the op's call (capture/cpu_checks.h); the same kernel running
// again in the graph, or PyTorch's Meta kernels inferring shapes, must not
// give them again, or others the CPU does not give.
#pragma once

#include <c10/util/Exception.h>

#include <string_view>
#include <vector>

namespace poptorch {

// While it lives, this thread's c10 warnings are dropped (the handler is
// thread-local: other threads keep theirs).
class WarningsDiscarded {
 public:
  WarningsDiscarded() : guard_(&discard()) {}
  WarningsDiscarded(const WarningsDiscarded&) = delete;
  WarningsDiscarded& operator=(const WarningsDiscarded&) = delete;

 private:
  class Discard : public c10::WarningHandler {
   public:
    void process(const c10::Warning&) override {}
  };
  // Stateless, so one serves every thread.
  static Discard& discard() {
    static Discard handler;
    return handler;
  }

  c10::WarningUtils::WarningHandlerGuard guard_;
};

// While it lives, this thread's c10 warnings are kept in `warnings()` instead.
class WarningsRecorded : public c10::WarningHandler {
 public:
  WarningsRecorded() : guard_(this) {}
  WarningsRecorded(const WarningsRecorded&) = delete;
  WarningsRecorded& operator=(const WarningsRecorded&) = delete;

  void process(const c10::Warning& warning) override { warnings_.push_back(warning); }
  const std::vector<c10::Warning>& warnings() const { return warnings_; }

 private:
  std::vector<c10::Warning> warnings_;
  c10::WarningUtils::WarningHandlerGuard guard_;
};

// Two warnings are the same if they say the same from the same place.
inline bool sameWarning(const c10::Warning& a, const c10::Warning& b) {
  return a.type().index() == b.type().index() && a.msg() == b.msg() &&
         a.source_location().line == b.source_location().line &&
         std::string_view(a.source_location().file) == b.source_location().file;
}

}  // namespace poptorch
