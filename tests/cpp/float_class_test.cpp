#include "capture/float_class.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace poptorch::capture {
namespace {

TEST(FloatClass, ValuesOnEitherSideOfADtypeLimitDiffer) {
  // 65504 is the largest half: 1e5 converted to half overflows, 2.0 does not.
  EXPECT_NE(rangeClass(2.0), rangeClass(1e5));
  EXPECT_NE(rangeClass(65504.0), rangeClass(65504.5));
  EXPECT_NE(rangeClass(127.0), rangeClass(127.5));  // int8
  EXPECT_NE(rangeClass(-128.0), rangeClass(-128.5));
  EXPECT_NE(rangeClass(0.0), rangeClass(-0.5));  // uint8's lowest
  const double float_max = std::numeric_limits<float>::max();
  EXPECT_NE(rangeClass(float_max), rangeClass(2 * float_max));
}

TEST(FloatClass, ValuesBetweenTheSameLimitsAreOneClass) {
  // A learning rate that changes at every step keeps its class.
  EXPECT_EQ(rangeClass(1e-3), rangeClass(0.9e-3));
  EXPECT_EQ(rangeClass(2.0), rangeClass(100.0));
  EXPECT_EQ(rangeClass(-2.0), rangeClass(-100.0));
  EXPECT_EQ(rangeClass(std::nan("")), -1);
}

TEST(FloatClass, SignClassSeparatesZeroOneAndInfinities) {
  EXPECT_EQ(signClass(0.5), signClass(0.25));
  EXPECT_NE(signClass(1.0), signClass(1.5));
  EXPECT_NE(signClass(0.0), signClass(-0.0 - 1e-9));
  EXPECT_NE(signClass(INFINITY), signClass(1e300));
}

}  // namespace
}  // namespace poptorch::capture
