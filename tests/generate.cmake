# ctest -R generate: convert SmolLM2 once, record transformers, compare the decoder,
# tokenizers and chat template (generate_checks), then run the CLI as a user would.
include(${CMAKE_CURRENT_LIST_DIR}/run_command.cmake)
run("${PYTHON}" "${SOURCE_DIR}/tools/convert_smollm2.py" "${SMOLLM2}")
file(REMOVE_RECURSE "${WORK_DIR}")
run("${PYTHON}" "${SOURCE_DIR}/tests/reference/make_generate_reference.py" "${WORK_DIR}" --smollm2 "${SMOLLM2}")
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
# A GGUF file with a SentencePiece vocabulary, as a user runs one: the same greedy ids.
execute_process(COMMAND "${CLI}" --model "${WORK_DIR}/tokenizer_sentencepiece/tiny_llama.gguf"
                  --prompt "What is a fortune cookie?" --max-new-tokens 24 --greedy --print-ids
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
file(READ "${WORK_DIR}/tokenizer_sentencepiece/tiny_llama_cli_expected.txt" expected)
string(STRIP "${expected}" expected)
message(STATUS "torchattn_generate on a SentencePiece GGUF file printed:\n${out}${err}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "${expected}")
  message(FATAL_ERROR "torchattn_generate --model tiny_llama.gguf (exit ${rc}) did not print '${expected}'")
endif()
# A Llama folder with a BERT's tokenizer.json generated garbage and exited 0: now one line
# naming the files, and exit status 1.
set(swapped "${WORK_DIR}/llama_with_a_bert_tokenizer")
file(REMOVE_RECURSE "${swapped}")
file(COPY "${WORK_DIR}/tiny/llama_gqa_tied/" DESTINATION "${swapped}")
file(WRITE "${swapped}/tokenizer.json" [=[{"model": {"type": "WordPiece", "unk_token": "[UNK]",
  "vocab": {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "[PAD]": 3, "hello": 4}},
  "normalizer": {"type": "BertNormalizer"}, "pre_tokenizer": {"type": "BertPreTokenizer"}}]=])
execute_process(COMMAND "${CLI}" --model "${swapped}" --prompt "hello" --max-new-tokens 4
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
string(STRIP "${err}" err)
string(FIND "${err}" "\n" newline)
string(CONCAT expected "torchattn_generate: --model: tokenizer: '${swapped}/tokenizer.json' is a WordPiece "
       "tokenizer; '${swapped}/config.json' holds a llama model, which expects a BPE tokenizer")
string(FIND "${err}" "${expected}" found)
message(STATUS "torchattn_generate on a Llama folder with a WordPiece tokenizer.json: exit ${rc}: ${err}")
if(NOT rc EQUAL 1 OR NOT found EQUAL 0 OR NOT newline EQUAL -1 OR NOT out STREQUAL "")
  message(FATAL_ERROR "torchattn_generate (exit ${rc}) did not print the one line '${expected}...'; printed:\n"
                      "${out}${err}")
endif()
