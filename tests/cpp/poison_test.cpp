#include <c10/core/Storage.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <stdexcept>

#include "device/ipu_device.h"

namespace poptorch {
namespace {

c10::Storage ipuStorage(size_t nbytes) {
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes, device::allocateLazy(nbytes, 0),
                      device::allocator(), /*resizable=*/true);
}

TEST(Poison, TheFirstErrorStaysUntilCured) {
  c10::Storage storage = ipuStorage(16);
  c10::StorageImpl& impl = *storage.unsafeGetStorageImpl();
  EXPECT_EQ(device::poisonOf(impl), nullptr);
  EXPECT_NO_THROW(device::checkNotPoisoned(impl));
  device::poison(impl, std::make_exception_ptr(std::out_of_range("first")));
  device::poison(impl, std::make_exception_ptr(std::out_of_range("second")));
  EXPECT_THROW(
      {
        try {
          device::checkNotPoisoned(impl);
        } catch (const std::out_of_range& error) {
          EXPECT_STREQ(error.what(), "first");
          throw;
        }
      },
      std::out_of_range);
  device::materialize(impl);
  device::growStorage(impl, 64);
  EXPECT_NE(device::poisonOf(impl), nullptr);  // still the same storage
  device::clearPoison(impl);
  EXPECT_NO_THROW(device::checkNotPoisoned(impl));
}

TEST(Poison, IsPerStorage) {
  c10::Storage a = ipuStorage(8);
  c10::Storage b = ipuStorage(8);
  device::poison(*a.unsafeGetStorageImpl(), std::make_exception_ptr(std::runtime_error("a")));
  EXPECT_NE(device::poisonOf(*a.unsafeGetStorageImpl()), nullptr);
  EXPECT_EQ(device::poisonOf(*b.unsafeGetStorageImpl()), nullptr);
}

}  // namespace
}  // namespace poptorch
