#include "capture/float_class.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e4m3fnuz.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Float8_e5m2fnuz.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace poptorch::capture {
namespace {

// The lowest and highest value of each type, as doubles, sorted and unique.
template <typename... T>
std::vector<double> rangeLimits() {
  std::vector<double> limits;
  (limits.push_back(static_cast<double>(std::numeric_limits<T>::lowest())), ...);
  (limits.push_back(static_cast<double>(std::numeric_limits<T>::max())), ...);
  std::sort(limits.begin(), limits.end());
  limits.erase(std::unique(limits.begin(), limits.end()), limits.end());
  return limits;
}

}  // namespace

int64_t signClass(double x) {
  return std::isnan(x) ? 0
         : x < 0       ? (std::isinf(x) ? 1 : 2)
         : x == 0      ? 3
         : x < 1       ? 4
         : x == 1      ? 5
                       : (std::isinf(x) ? 7 : 6);
}

int64_t rangeClass(double x) {
  static const std::vector<double> kLimits =
      rangeLimits<int8_t, uint8_t, int16_t, uint16_t, int32_t, uint32_t, int64_t, uint64_t,
                  c10::Half, c10::BFloat16, float, c10::Float8_e5m2, c10::Float8_e4m3fn,
                  c10::Float8_e5m2fnuz, c10::Float8_e4m3fnuz>();
  if (std::isnan(x)) return -1;
  const auto at = std::lower_bound(kLimits.begin(), kLimits.end(), x);
  const bool is_limit = at != kLimits.end() && *at == x;
  return 2 * static_cast<int64_t>(at - kLimits.begin()) + (is_limit ? 1 : 0);
}

}  // namespace poptorch::capture
