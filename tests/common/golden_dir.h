#pragma once

// The folder of the golden fixtures (tests/golden in the source tree).

namespace golden {

const char* directory();

}  // namespace golden
