# How the tests and the apps compile (not the library): one precompiled LibTorch header
# for all of them (TORCHATTN_PCH), and an optimization level of their own
# (TORCHATTN_TESTS_APPS_OPT).
#
# Each test or app file that includes <torch/torch.h> spends up to 40 of its 60-90 s
# reading headers, most of them LibTorch's (GCC 12, -O3, a 2-core CI machine); there
# are about fifty such files outside the unity builds, and CI builds most of them
# twice (`make test`, `make build-cuda`). One precompiled header, built by
# torchattn_pch with the flags every consumer has (it links torchattn, so a sanitizer
# build's flags too), is reused by every executable and static library in tests/ and
# apps/. It holds LibTorch only, never torchattn's own headers, so a file that forgets
# an include of ours still fails to compile, and it is force-included before the
# file's first line: sources keep their own includes and compile unchanged without it.
# GCC only (its .gch needs the same macros and code-generation flags: -fPIC targets and
# CUDA sources are left out). Off for clang-tidy's build (make lint) and the fuzzers.
#
# TORCHATTN_TESTS_APPS_OPT (empty: the build type's, -O3 in Release) compiles the tests
# and apps at another level while the library keeps the build type's: CI passes -O1
# (the Makefile's TESTS_APPS_OPT, which .ci/run sets), which halves their compile time on its two cores;
# the kernels the tests run are the library's, optimized as users get them.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND NOT TORCHATTN_FUZZ)
  set(torchattn_pch_default ON)
else()
  set(torchattn_pch_default OFF)
endif()
option(TORCHATTN_PCH "Precompile LibTorch's headers once for the tests and apps (GCC)" ${torchattn_pch_default})
set(TORCHATTN_TESTS_APPS_OPT "" CACHE STRING "An optimization flag for the tests and apps only (e.g. -O1); empty: the build type's")
if(TORCHATTN_TESTS_APPS_OPT AND NOT TORCHATTN_TESTS_APPS_OPT MATCHES "^-O[0-3sg]$")
  message(FATAL_ERROR "TORCHATTN_TESTS_APPS_OPT: expected -O0, -O1, -O2, -O3, -Os or -Og, got '${TORCHATTN_TESTS_APPS_OPT}'")
endif()

# Every C++-only executable and static library (not position-independent) below dir.
function(torchattn_tests_and_apps_flags dir)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    get_target_property(pic ${target} POSITION_INDEPENDENT_CODE)
    get_target_property(sources ${target} SOURCES)
    list(FILTER sources INCLUDE REGEX "\\.cu$")
    if(type MATCHES "^(EXECUTABLE|STATIC_LIBRARY)$" AND NOT pic AND NOT sources)
      if(TORCHATTN_TESTS_APPS_OPT)
        target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${TORCHATTN_TESTS_APPS_OPT}>)
      endif()
      if(TARGET torchattn_pch)
        target_precompile_headers(${target} REUSE_FROM torchattn_pch)
      endif()
    endif()
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(subdir IN LISTS subdirs)
    torchattn_tests_and_apps_flags(${subdir})
  endforeach()
endfunction()

if(TORCHATTN_PCH AND (TORCHATTN_BUILD_TESTS OR TORCHATTN_BUILD_APPS))
  file(WRITE ${PROJECT_BINARY_DIR}/torchattn_pch.cpp "// the precompiled header's own unit\n")
  add_library(torchattn_pch OBJECT ${PROJECT_BINARY_DIR}/torchattn_pch.cpp)
  target_link_libraries(torchattn_pch PRIVATE torchattn::torchattn)
  target_precompile_headers(torchattn_pch PRIVATE <torch/torch.h>)
  if(TORCHATTN_TESTS_APPS_OPT)
    target_compile_options(torchattn_pch PRIVATE ${TORCHATTN_TESTS_APPS_OPT})
  endif()
endif()
get_property(torchattn_subdirs DIRECTORY ${PROJECT_SOURCE_DIR} PROPERTY SUBDIRECTORIES)
foreach(dir tests apps)
  if("${PROJECT_SOURCE_DIR}/${dir}" IN_LIST torchattn_subdirs)
    torchattn_tests_and_apps_flags(${PROJECT_SOURCE_DIR}/${dir})
  endif()
endforeach()
