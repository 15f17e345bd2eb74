# LibTorch's headers precompiled once for the tests and the apps (TORCHATTN_PCH).
#
# Each test or app file that includes <torch/torch.h> spends about 40 of its 60-90 s
# reading LibTorch's headers (GCC 12, -O3, on the 2-core CI machine); there are about
# fifty such files outside the unity builds, and CI builds most of them twice (`make
# test`, `make build-cuda`). One precompiled header, built by torchattn_pch with the
# flags every consumer has (it links torchattn, so a sanitizer build's flags too), is
# reused by every executable and static library in tests/ and apps/. It holds LibTorch
# only, never torchattn's own headers, so a file that forgets an include of ours still
# fails to compile, and it is force-included before the file's first line: sources keep
# their own includes and compile unchanged without it.
#
# GCC only (its .gch needs the same macros and code-generation flags: -fPIC targets and
# CUDA sources are left out). Off for clang-tidy's build (make lint) and the fuzzers.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND NOT TORCHATTN_FUZZ)
  set(torchattn_pch_default ON)
else()
  set(torchattn_pch_default OFF)
endif()
option(TORCHATTN_PCH "Precompile LibTorch's headers once for the tests and apps (GCC)" ${torchattn_pch_default})

if(TORCHATTN_PCH AND (TORCHATTN_BUILD_TESTS OR TORCHATTN_BUILD_APPS))
  file(WRITE ${PROJECT_BINARY_DIR}/torchattn_pch.cpp "// the precompiled header's own unit\n")
  add_library(torchattn_pch OBJECT ${PROJECT_BINARY_DIR}/torchattn_pch.cpp)
  target_link_libraries(torchattn_pch PRIVATE torchattn::torchattn)
  target_precompile_headers(torchattn_pch PRIVATE <torch/torch.h>)

  # Every C++-only executable and static library (not position-independent) below dir.
  function(torchattn_use_pch dir)
    get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
    foreach(target IN LISTS targets)
      get_target_property(type ${target} TYPE)
      get_target_property(pic ${target} POSITION_INDEPENDENT_CODE)
      get_target_property(sources ${target} SOURCES)
      list(FILTER sources INCLUDE REGEX "\\.cu$")
      if(type MATCHES "^(EXECUTABLE|STATIC_LIBRARY)$" AND NOT pic AND NOT sources)
        target_precompile_headers(${target} REUSE_FROM torchattn_pch)
      endif()
    endforeach()
    get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
    foreach(subdir IN LISTS subdirs)
      torchattn_use_pch(${subdir})
    endforeach()
  endfunction()
  foreach(dir tests apps)
    if(EXISTS ${PROJECT_SOURCE_DIR}/${dir}/CMakeLists.txt)
      get_property(known DIRECTORY ${PROJECT_SOURCE_DIR} PROPERTY SUBDIRECTORIES)
      if("${PROJECT_SOURCE_DIR}/${dir}" IN_LIST known)
        torchattn_use_pch(${PROJECT_SOURCE_DIR}/${dir})
      endif()
    endif()
  endforeach()
endif()
