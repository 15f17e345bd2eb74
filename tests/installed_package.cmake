# ctest -R installed_package: install torchattn to a fresh prefix, build
# tests/consumer against it with find_package(torchattn), then compare the
# consumer's output with the notebooks' Python code on seeds and shapes that the
# unit tests do not use; and import the installed torchattn_interop.py. With the
# models component: build README's model-folder program (tests/consumer_models, which
# README shows verbatim) with find_package(torchattn COMPONENTS models), run it on
# SmolLM2 and MiniLM, and compare with transformers and sentence-transformers.

foreach(var SOURCE_DIR BUILD_DIR WORK_DIR TORCH_DIR PYTHON GENERATOR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "installed_package.cmake: -D${var}=... is required")
  endif()
endforeach()

include(${CMAKE_CURRENT_LIST_DIR}/run_command.cmake)

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/consumer" -B "${WORK_DIR}/build" -G "${GENERATOR}"
    -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${prefix}" "-DTorch_DIR=${TORCH_DIR}")
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run("${PYTHON}" "${SOURCE_DIR}/tests/consumer/check_consumer.py" --exe "${WORK_DIR}/build/consumer")
# The installed torchattn_interop.py imports from where find_package says it is.
file(READ "${WORK_DIR}/build/torchattn_python_dir.txt" python_dir)
run("${PYTHON}" -c "import sys\nsys.path.insert(0, sys.argv[1])\nimport torchattn_interop\nprint('torchattn_interop from', torchattn_interop.__file__)" "${python_dir}")

if(WITH_MODELS)
  file(READ "${SOURCE_DIR}/README.md" readme)
  file(READ "${SOURCE_DIR}/tests/consumer_models/main.cpp" program)
  string(FIND "${readme}" "${program}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "README.md does not show tests/consumer_models/main.cpp as it is: update one or the other")
  endif()
  run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/consumer_models" -B "${WORK_DIR}/models-build" -G "${GENERATOR}"
      -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${prefix}" "-DTorch_DIR=${TORCH_DIR}")
  run(${CMAKE_COMMAND} --build "${WORK_DIR}/models-build")
  # make test-gpu on a machine whose Python lacks the model folders' packages sets this,
  # and says in its test stage that the program was built but not run.
  if("$ENV{TORCHATTN_NO_MODEL_FOLDERS}" STREQUAL "1")
    message(STATUS "TORCHATTN_NO_MODEL_FOLDERS=1: README's model-folder program built against the installed package, "
                   "not run")
  else()
    run("${PYTHON}" "${SOURCE_DIR}/tools/convert_smollm2.py" "${SMOLLM2}")
    run("${PYTHON}" "${SOURCE_DIR}/tests/consumer_models/check_models_consumer.py" --exe "${WORK_DIR}/models-build/models_consumer"
        --smollm2 "${SMOLLM2}")
  endif()
endif()
