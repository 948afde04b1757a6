// Reaching an op's own autograd kernel from an AutogradIPU kernel that
// replaces it.
#pragma once

#include <c10/core/DispatchKeySet.h>

namespace poptorch::capture {

// The keys that reach an op's own autograd kernel (PyTorch's generated one,
// through AutogradOther, which every backend without a key of its own shares)
// from an AutogradIPU kernel that replaces it: only the keys below autograd, as
// every kernel redispatches (the Python dispatcher's keys above would come back).
inline c10::DispatchKeySet ownAutogradKernel(c10::DispatchKeySet keys) {
  constexpr c10::DispatchKeySet kBelow(c10::DispatchKeySet::FULL_AFTER,
                                       c10::DispatchKey::AutogradFunctionality);
  return (keys & kBelow).add(c10::DispatchKey::AutogradOther);
}

}  // namespace poptorch::capture
