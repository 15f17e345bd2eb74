# ctest -R installed_package: install torchattn to a fresh prefix, build
# examples/consumer against it with find_package(torchattn), then compare the
# consumer's output with the notebooks' Python code on seeds and shapes that the
# unit tests do not use.

foreach(var SOURCE_DIR BUILD_DIR WORK_DIR TORCH_DIR PYTHON GENERATOR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "installed_package.cmake: -D${var}=... is required")
  endif()
endforeach()

include(${CMAKE_CURRENT_LIST_DIR}/run_command.cmake)

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/examples/consumer" -B "${WORK_DIR}/build" -G "${GENERATOR}"
    -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${prefix}" "-DTorch_DIR=${TORCH_DIR}")
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run("${PYTHON}" "${SOURCE_DIR}/tools/check_consumer.py" --exe "${WORK_DIR}/build/consumer")
