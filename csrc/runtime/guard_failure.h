// The failure of a guard: a program specialised on a value the host read while
// the step was captured met another value. The program does not apply to this
// run; Program::run undoes what it changed before the guard.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace poptorch::runtime {

class GuardFailure : public std::runtime_error {
 public:
  explicit GuardFailure(const std::string& what) : std::runtime_error(what) {}

  // Set by the runtime: the guard node (its index as captured) and where the
  // user's code read the value it guards.
  int32_t node = -1;
  std::string site;
};

}  // namespace poptorch::runtime
