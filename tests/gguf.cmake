# ctest -R gguf: GGUF files written by llama.cpp's own Python writer (the gguf package;
# tests/reference/make_gguf_reference.py), then read by GgufFile (serialize/gguf_checks).
include(${CMAKE_CURRENT_LIST_DIR}/run_command.cmake)
file(REMOVE_RECURSE "${WORK_DIR}")
run("${PYTHON}" "${SOURCE_DIR}/tests/reference/make_gguf_reference.py" "${WORK_DIR}")
set(ENV{TORCHATTN_GGUF_REFERENCE} "${WORK_DIR}")
run("${CHECK}" --gtest_brief=1)
