# Fails when clang-format (per .clang-format) would change any source file.
file(GLOB_RECURSE files
  ${SRC}/include/*.hpp ${SRC}/include/*.cuh ${SRC}/tests/*.cpp ${SRC}/tests/*.hpp
  ${SRC}/tests/*.cu ${SRC}/examples/*.cpp ${SRC}/examples/*.hpp ${SRC}/examples/*.cu
  ${SRC}/bench/*.cpp ${SRC}/bench/*.hpp ${SRC}/python/src/*.cpp ${SRC}/python/src/*.hpp)
execute_process(COMMAND ${CLANG_FORMAT} --dry-run --Werror ${files}
  RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "clang-format would change these files (run clang-format -i):\n${err}")
endif()
