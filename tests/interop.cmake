# ctest -R interop: Python saves the notebook modules, C++ loads them and saves its
# own, Python loads those.
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()
file(REMOVE_RECURSE "${WORK_DIR}")
run("${PYTHON}" "${SOURCE_DIR}/tools/interop_check.py" export "${WORK_DIR}")
run("${CHECK}" "${WORK_DIR}")
run("${PYTHON}" "${SOURCE_DIR}/tools/interop_check.py" verify "${WORK_DIR}")
