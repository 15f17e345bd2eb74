#pragma once

// The decoders' RMSNorm is the library's (torchattn/rms_norm.h), under the models'
// namespace too.

#include <torchattn/rms_norm.h>

namespace torchattn::models {

using torchattn::RMSNorm;
using torchattn::RMSNormImpl;

}  // namespace torchattn::models
