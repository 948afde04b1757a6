// Settings read from environment variables (POPTORCH_*), parsed one way.
#pragma once

#include <cstdint>

namespace poptorch {

// The integer in environment variable `name`, or `fallback` when it is unset or
// empty. A value that is not an integer of at least `minimum` is a ValueError
// naming the variable.
int64_t integerFromEnvironment(const char* name, int64_t fallback, int64_t minimum);

}  // namespace poptorch
