#include "common/denormal_mode.h"

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#define POPTORCH_HAS_MXCSR 1
#endif

namespace poptorch {
namespace {

// The bits at::cpu::set_flush_denormal sets and clears together.
constexpr uint32_t kFlushToZero = 0x8000;
constexpr uint32_t kDenormalsAreZero = 0x0040;
constexpr uint32_t kDenormalBits = kFlushToZero | kDenormalsAreZero;

thread_local std::optional<uint32_t> mode_of_call;

}  // namespace

bool isDenormalMode(uint32_t mode) { return (mode & ~kDenormalBits) == 0; }

#ifdef POPTORCH_HAS_MXCSR
uint32_t denormalMode() { return _mm_getcsr() & kDenormalBits; }

DenormalModeAs::DenormalModeAs(uint32_t mode) : before_(denormalMode()), changed_(mode != before_) {
  if (changed_) _mm_setcsr((_mm_getcsr() & ~kDenormalBits) | mode);
}

DenormalModeAs::~DenormalModeAs() {
  if (changed_) _mm_setcsr((_mm_getcsr() & ~kDenormalBits) | before_);
}
#else
// PyTorch sets no denormal mode here either (set_flush_denormal returns False).
uint32_t denormalMode() { return 0; }
DenormalModeAs::DenormalModeAs(uint32_t /*mode*/) : before_(0), changed_(false) {}
DenormalModeAs::~DenormalModeAs() = default;
#endif

DenormalModeOfCall::DenormalModeOfCall(uint32_t mode) : outer_(mode_of_call) {
  mode_of_call = mode;
}

DenormalModeOfCall::~DenormalModeOfCall() { mode_of_call = outer_; }

std::optional<uint32_t> DenormalModeOfCall::current() { return mode_of_call; }

}  // namespace poptorch
