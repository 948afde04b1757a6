// Where in the user's Python code the current operation was called, so that
// errors and guards can name the line. The core does not depend on Python: the
// bindings install the function that answers.
#pragma once

#include <string>

namespace poptorch {

using SourceLocationProvider = std::string (*)();

// Installed once, when poptorch._C is imported.
void setSourceLocationProvider(SourceLocationProvider provider);

// "file:line (in function)" of the innermost user frame, or "" if unknown.
std::string userSourceLocation();

}  // namespace poptorch
