# ctest -R interop: Python saves the notebook modules, C++ loads them and saves its
# own, Python loads those.
include(${CMAKE_CURRENT_LIST_DIR}/run_command.cmake)
file(REMOVE_RECURSE "${WORK_DIR}")
run("${PYTHON}" "${SOURCE_DIR}/tests/serialize/interop_check.py" export "${WORK_DIR}")
run("${CHECK}" "${WORK_DIR}")
run("${PYTHON}" "${SOURCE_DIR}/tests/serialize/interop_check.py" verify "${WORK_DIR}")
