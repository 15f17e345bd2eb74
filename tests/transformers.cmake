# ctest -R transformers: record transformers' attention layers, then compare
# torchattn with them.
include(${CMAKE_CURRENT_LIST_DIR}/run_command.cmake)
file(REMOVE_RECURSE "${WORK_DIR}")
run("${PYTHON}" "${SOURCE_DIR}/tests/reference/make_transformers_reference.py" "${WORK_DIR}")
set(ENV{TORCHATTN_TRANSFORMERS_REFERENCE} "${WORK_DIR}")
run("${CHECK}" --gtest_brief=1)
