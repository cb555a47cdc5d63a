# Flags for relokv's own tests, examples and benchmarks (never exported to consumers).
add_library(relokv_dev_flags INTERFACE)
target_compile_options(relokv_dev_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
    -Wold-style-cast -Wcast-align -Woverloaded-virtual -Wimplicit-fallthrough>)
if(RELOKV_WERROR)
  target_compile_options(relokv_dev_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
endif()
if(RELOKV_SANITIZE)
  set(_san -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  target_compile_options(relokv_dev_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:${_san}>)
  # GCC 12 under ASan at -O1 reports -Wmaybe-uninitialized for every std::variant move (its
  # bug 80635 family); the same code is clean in the optimized and clang builds.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(relokv_dev_flags INTERFACE
      $<$<COMPILE_LANGUAGE:CXX>:-Wno-maybe-uninitialized>)
  endif()
  target_link_options(relokv_dev_flags INTERFACE ${_san})
  # Tests that repeat a check many times for statistical reach repeat it fewer times here
  # (the Release run does the full count); memory errors show in the first instances.
  target_compile_definitions(relokv_dev_flags INTERFACE RELOKV_SANITIZED_BUILD=1)
endif()
if(RELOKV_TSAN)
  if(RELOKV_SANITIZE)
    message(FATAL_ERROR "RELOKV_TSAN and RELOKV_SANITIZE cannot be combined")
  endif()
  set(_tsan -fsanitize=thread -fno-omit-frame-pointer)
  target_compile_options(relokv_dev_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:${_tsan}>)
  target_link_options(relokv_dev_flags INTERFACE ${_tsan})
  target_compile_definitions(relokv_dev_flags INTERFACE RELOKV_SANITIZED_BUILD=1)
endif()
target_link_libraries(relokv_dev_flags INTERFACE relokv::relokv)

# Benchmarks and the report are built for the machine they run on, or for the instruction set
# RELOKV_MARCH names (-march=haswell: an AVX2 host's build on any x86-64 host, for the AVX2
# figures of bench/serve_rag --isa avx2).
set(RELOKV_MARCH "native" CACHE STRING "-march of the engine, the benchmarks and the report")
add_library(relokv_native_flags INTERFACE)
include(CheckCXXCompilerFlag)
check_cxx_compiler_flag(-march=${RELOKV_MARCH} RELOKV_HAS_MARCH_${RELOKV_MARCH})
if(RELOKV_HAS_MARCH_${RELOKV_MARCH})
  target_compile_options(relokv_native_flags
                         INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-march=${RELOKV_MARCH}>)
elseif(NOT RELOKV_MARCH STREQUAL "native")
  message(FATAL_ERROR "RELOKV_MARCH=${RELOKV_MARCH}: the compiler does not take -march=${RELOKV_MARCH}")
endif()
