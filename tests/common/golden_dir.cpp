// Where the golden fixtures are: the one file compiled with the source tree's path
// (TORCHATTN_GOLDEN_DIR, tests/CMakeLists.txt), so that no other test object holds an
// absolute path and a fresh clone in another folder reuses them from the compiler
// cache (Makefile: ccache).

#include "common/golden_dir.h"

namespace golden {

const char* directory() { return TORCHATTN_GOLDEN_DIR; }

}  // namespace golden
