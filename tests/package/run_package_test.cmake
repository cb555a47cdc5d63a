# cmake -DMODE=... -DSRC=... -DBIN=... -DWORK=... -DVERSION=... -DCXX=... -P run_package_test.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})

function(run)
  execute_process(COMMAND ${ARGN} WORKING_DIRECTORY ${WORK} RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "package test '${MODE}' failed: ${cmd}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

set(consumer ${SRC}/tests/package/consumer)
set(common -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX} -DEXPECTED_VERSION=${VERSION}
    -DCMAKE_CXX_COMPILER_LAUNCHER=)

if(MODE STREQUAL "find_package")
  run(${CMAKE_COMMAND} --install ${BIN} --prefix ${WORK}/prefix)
  run(${CMAKE_COMMAND} -S ${consumer} -B ${WORK}/build ${common} -DCONSUME=find_package
      -DCMAKE_PREFIX_PATH=${WORK}/prefix)
elseif(MODE STREQUAL "build_tree")
  run(${CMAKE_COMMAND} -S ${consumer} -B ${WORK}/build ${common} -DCONSUME=find_package
      -Drelokv_DIR=${BIN})
elseif(MODE STREQUAL "add_subdirectory")
  run(${CMAKE_COMMAND} -S ${consumer} -B ${WORK}/build ${common} -DCONSUME=add_subdirectory
      -DRELOKV_SOURCE_DIR=${SRC})
elseif(MODE STREQUAL "vendored")
  # A vendor tree holds a copy of include/ alone, compiled with a plain compiler command
  # (and linked with libcrypto, which the stored blocks need: README, Dependencies).
  file(COPY ${SRC}/include/ DESTINATION ${WORK}/vendor/include)
  string(REPLACE "." ";" v "${VERSION}")
  list(GET v 0 vmaj)
  list(GET v 1 vmin)
  list(GET v 2 vpat)
  run(${CXX} -std=c++20 -Wall -Wextra -Werror -I${WORK}/vendor/include
      -DEXPECTED_MAJOR=${vmaj} -DEXPECTED_MINOR=${vmin} -DEXPECTED_PATCH=${vpat}
      ${consumer}/main.cpp -o ${WORK}/consumer -lcrypto)
  run(${WORK}/consumer)
  return()
else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()
run(${CMAKE_COMMAND} --build ${WORK}/build)
run(${WORK}/build/relokv_consumer)
if(EXISTS ${WORK}/build/relokv_redis_consumer)
  run(${WORK}/build/relokv_redis_consumer)
endif()
