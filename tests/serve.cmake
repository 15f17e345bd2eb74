# ctest -R serve: convert SmolLM2 once (as ctest -R generate does), then CHECKS (a
# script: tests/serve/serve_checks.py, or tests/serve/door_checks.py) starts torchattn_serve
# and talks to it. The servers' logs stay in WORK_DIR.
include(${CMAKE_CURRENT_LIST_DIR}/run_command.cmake)
run("${PYTHON}" "${SOURCE_DIR}/tools/convert_smollm2.py" "${SMOLLM2}")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
run("${PYTHON}" "${CHECKS}" --server "${SERVER}" --model "${SMOLLM2}" --log-dir "${WORK_DIR}")
