# ctest -R generate: convert SmolLM2 once, record transformers, compare the decoder,
# tokenizers and chat template (generate_checks), then run the CLI as a user would.
include(${CMAKE_CURRENT_LIST_DIR}/run_command.cmake)
run("${PYTHON}" "${SOURCE_DIR}/tools/convert_smollm2.py" "${SMOLLM2}")
file(REMOVE_RECURSE "${WORK_DIR}")
run("${PYTHON}" "${SOURCE_DIR}/tools/make_generate_reference.py" "${WORK_DIR}" --smollm2 "${SMOLLM2}")
set(ENV{TORCHATTN_GENERATE_REFERENCE} "${WORK_DIR}")
set(ENV{TORCHATTN_SMOLLM2} "${SMOLLM2}")
run("${CHECK}" --gtest_brief=1)
run("${SEQ2SEQ_CHECK}" --gtest_brief=1)
# The command line, exactly as documented: the same greedy ids as transformers.
execute_process(COMMAND "${CLI}" --model "${SMOLLM2}" --prompt "What is the capital of France?" --chat
                  --max-new-tokens 48 --greedy --print-ids
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
file(READ "${WORK_DIR}/cli_expected.txt" expected)
string(STRIP "${expected}" expected)
message(STATUS "torchattn_generate printed:\n${out}${err}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "${expected}")
  message(FATAL_ERROR "torchattn_generate (exit ${rc}) did not print '${expected}'")
endif()
