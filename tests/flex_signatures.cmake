# ctest -R flex_signatures: builds TARGET (backends/flex_signatures.cpp with FLEX_REFUSED),
# which must not compile, and reads the compiler's words: each slip's message is there,
# one error a slip, and no error is reported from inside the flex kernels' headers.
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(words "${out}${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled: flex_attention took the mods it must refuse")
endif()
set(expected
  "flex::Dual: a score_mod cannot cast its score to a number"
  "flex_attention: expected a score_mod callable as score_mod(auto score, int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx)"
  "flex: expected a mask_mod callable as mask_mod(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx) -> bool")
foreach(text IN LISTS expected)
  string(FIND "${words}" "${text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${TARGET}: the compiler did not say \"${text}\":\n${words}")
  endif()
endforeach()
string(REGEX MATCHALL ": error: " errors "${words}")
list(LENGTH errors count)
# Six slips: one error each (GCC 12 gives exactly that).
if(NOT count EQUAL 6)
  message(FATAL_ERROR "${TARGET}: ${count} errors for 6 slips, expected one each:\n${words}")
endif()
if(words MATCHES "detail/flex/cpu_[a-z_]+\\.h:[0-9]+:[0-9]+: error")
  message(FATAL_ERROR "${TARGET}: an error from inside the kernels' headers:\n${words}")
endif()
message(STATUS "${TARGET}: refused with ${count} errors, each naming the expected form")
