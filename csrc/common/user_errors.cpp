#include "common/user_errors.h"

#include <c10/util/Exception.h>

#include <atomic>

namespace poptorch {
namespace {

// Set once, when the extension module is imported; read by any thread.
std::atomic<UserErrorRaiser> raiser{nullptr};

}  // namespace

void setUserErrorRaiser(UserErrorRaiser new_raiser) { raiser.store(new_raiser); }

void raiseUserError(UserError kind, const std::string& message) {
  if (const UserErrorRaiser raise = raiser.load()) raise(kind, message);
  TORCH_CHECK_VALUE(kind != UserError::kValue, message);
  TORCH_CHECK_NOT_IMPLEMENTED(false, message);
}

}  // namespace poptorch
