// Bad input the core finds: what the ipu cannot hold or run (quantized,
// sparse and strided nested tensors, an op without a host kernel...) and bad
// values of poptorch's environment variables, refused at the call. Raised on
// Python's side as a poptorch.Error, so bad input is one kind of error
// whichever layer finds it: poptorch.UnsupportedError (also the
// NotImplementedError PyTorch raises for a kernel it lacks) and
// poptorch.ValueCompatibleError (also a ValueError). The core does not know
// Python: the extension module installs how to raise them; without it (the C++
// tests) they are c10's NotImplementedError and ValueError.
#pragma once

#include <c10/util/StringUtil.h>

#include <string>

namespace poptorch {

enum class UserError { kUnsupported, kValue };

// Throws an exception for `message`, or returns to leave it to c10's.
using UserErrorRaiser = void (*)(UserError kind, const std::string& message);

void setUserErrorRaiser(UserErrorRaiser raiser);

[[noreturn]] void raiseUserError(UserError kind, const std::string& message);

}  // namespace poptorch

// Raise the `kind` of error with the message made of the remaining arguments
// unless `cond`.
#define POPTORCH_CHECK_USER(kind, cond, ...)                                            \
  do {                                                                                  \
    if (C10_UNLIKELY(!(cond))) {                                                        \
      ::poptorch::raiseUserError(::poptorch::UserError::kind, ::c10::str(__VA_ARGS__)); \
    }                                                                                   \
  } while (false)
#define POPTORCH_CHECK_SUPPORTED(cond, ...) POPTORCH_CHECK_USER(kUnsupported, cond, __VA_ARGS__)
#define POPTORCH_CHECK_VALUE(cond, ...) POPTORCH_CHECK_USER(kValue, cond, __VA_ARGS__)
