# ctest -R generate_device: the generate stage of `make test-gpu` on the CPU, with two
# layers of SmolLM2-135M's shape: transformers' reference
# (tests/reference/make_device_reference.py), then tests/models/generate_device_check.cpp
# against it.
include(${CMAKE_CURRENT_LIST_DIR}/run_command.cmake)
file(REMOVE_RECURSE "${WORK_DIR}")
run("${PYTHON}" "${SOURCE_DIR}/tests/reference/make_device_reference.py" "${WORK_DIR}" --device cpu --layers 2)
run("${CHECK}" --model "${WORK_DIR}/model" --reference "${WORK_DIR}" --device cpu)

# The command line's messages for bad arguments (issue-style slips), on that model:
# each exits non-zero with a message naming the argument and what it expects.
function(expect_cli_error expected)
  execute_process(COMMAND "${CLI}" --model "${WORK_DIR}/model" ${ARGN}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  string(FIND "${out}${err}" "${expected}" at)
  if(rc EQUAL 0 OR at EQUAL -1)
    message(FATAL_ERROR "torchattn_generate ${ARGN}: exit ${rc}, expected a failure saying '${expected}', got:\n${out}${err}")
  endif()
endfunction()
expect_cli_error("--max-new-tokens: expected at least 1, got 0" --prompt-ids 1,2 --max-new-tokens 0)
expect_cli_error("--prompt-ids: 'abc' is not a token id (expected comma-separated integers >= 0" --prompt-ids 1,abc,3)
expect_cli_error("--prompt-ids: id 49152 is past the model's vocabulary of 49152 tokens" --prompt-ids 1,49152)
expect_cli_error("--top-k: expected at least 1, got 0" --prompt-ids 1,2 --top-k 0)
expect_cli_error("--seed: expected at least 0, got -1" --prompt-ids 1,2 --seed -1)
expect_cli_error("--top-p: expected a number in (0, 1], got 1.5" --prompt-ids 1,2 --top-p 1.5)
expect_cli_error("--temperature: expected a number > 0, got 0" --prompt-ids 1,2 --temperature 0)
# --help states the defaults; sampling without --seed draws one and says which.
execute_process(COMMAND "${CLI}" --help OUTPUT_VARIABLE help RESULT_VARIABLE rc)
foreach(default "--max-new-tokens INT:>=1=64" "--top-k INT:>=1=all" "--seed TEXT:>=0=random" "--dtype TEXT:{float32,bfloat16,int8,dynamic-int8,int4}=float32")
  string(FIND "${help}" "${default}" at)
  if(NOT rc EQUAL 0 OR at EQUAL -1)
    message(FATAL_ERROR "torchattn_generate --help does not show '${default}':\n${help}")
  endif()
endforeach()
foreach(run 1 2)
  execute_process(COMMAND "${CLI}" --model "${WORK_DIR}/model" --prompt-ids 1,2,3 --top-k 50 --max-new-tokens 8
                          --print-ids OUTPUT_VARIABLE out${run} ERROR_VARIABLE err${run} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT err${run} MATCHES "sampling with seed ([0-9]+); pass --seed")
    message(FATAL_ERROR "sampling without --seed did not print its seed:\n${err${run}}")
  endif()
  set(seed${run} "${CMAKE_MATCH_1}")
endforeach()
# The printed seed repeats the run.
execute_process(COMMAND "${CLI}" --model "${WORK_DIR}/model" --prompt-ids 1,2,3 --top-k 50 --max-new-tokens 8
                        --print-ids --seed ${seed1} OUTPUT_VARIABLE again RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT again STREQUAL out1)
  message(FATAL_ERROR "--seed ${seed1} did not repeat the run:\n${out1}\nvs\n${again}")
endif()
# --save: a folder of int8 weights that --model loads as it is, with the same tokens as
# freezing the float32 checkpoint at load; float32 is refused.
expect_cli_error("--save: writes bfloat16, int8 or int4 weights; give --dtype bfloat16, int8 or int4"
                 --save "${WORK_DIR}/int8")
expect_cli_error("--save: dynamic-int8 weights are quantized at load, not saved"
                 --dtype dynamic-int8 --save "${WORK_DIR}/int8")
execute_process(COMMAND "${CLI}" --model "${WORK_DIR}/model" --dtype int8 --save "${WORK_DIR}/int8"
                ERROR_VARIABLE saved RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT EXISTS "${WORK_DIR}/int8/torchattn_weights.json")
  message(FATAL_ERROR "torchattn_generate --dtype int8 --save failed (${rc}):\n${saved}")
endif()
execute_process(COMMAND "${CLI}" --model "${WORK_DIR}/model" --dtype int8 --prompt-ids 1,2,3 --greedy
                        --max-new-tokens 8 --print-ids OUTPUT_VARIABLE frozen_at_load RESULT_VARIABLE rc1)
execute_process(COMMAND "${CLI}" --model "${WORK_DIR}/int8" --prompt-ids 1,2,3 --greedy --max-new-tokens 8
                        --print-ids OUTPUT_VARIABLE from_folder ERROR_VARIABLE folder_err RESULT_VARIABLE rc2)
if(NOT rc1 EQUAL 0 OR NOT rc2 EQUAL 0 OR NOT from_folder STREQUAL frozen_at_load OR NOT folder_err MATCHES "int8")
  message(FATAL_ERROR "the --save folder does not generate as --dtype int8 does:\n${frozen_at_load}\nvs\n"
                      "${from_folder}\n${folder_err}")
endif()
message(STATUS "torchattn_generate: every bad argument named; seeds ${seed1} and ${seed2} drawn, --seed repeats; "
               "an int8 --save folder generates as --dtype int8")
