#include "common/source_location.h"

#include <atomic>

namespace poptorch {
namespace {

// Set once at import, read by any capturing thread.
std::atomic<SourceLocationProvider> provider{nullptr};

}  // namespace

void setSourceLocationProvider(SourceLocationProvider p) { provider.store(p); }

std::string userSourceLocation() {
  const SourceLocationProvider p = provider.load();
  return p != nullptr ? p() : std::string();
}

}  // namespace poptorch
