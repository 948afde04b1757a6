#include "common/environment.h"

#include <cstdlib>

#include "common/user_errors.h"

namespace poptorch {

int64_t integerFromEnvironment(const char* name, int64_t fallback, int64_t minimum) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  const long long parsed = std::strtoll(value, &end, 10);
  POPTORCH_CHECK_VALUE(end != value && *end == '\0' && parsed >= minimum, name,
                       " must be an integer of at least ", minimum, ", got '", value, "'");
  return parsed;
}

}  // namespace poptorch
