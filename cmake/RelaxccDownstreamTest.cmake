# CTest script: install relaxcc into a scratch prefix, then configure, build
# and run one project of examples/ against it with find_package(relaxcc).
# Inputs: SOURCE_DIR, BINARY_DIR, WORK_DIR, MPIEXEC; EXAMPLE, the folder
# under examples/ (default downstream), whose executable has the folder's
# name; RANKS, the mpiexec ranks to run it at (default 2; 0 runs it without
# mpiexec).
if(NOT DEFINED EXAMPLE)
  set(EXAMPLE downstream)
endif()
if(NOT DEFINED RANKS)
  set(RANKS 2)
endif()
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()

run(${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${prefix})
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/${EXAMPLE} -B ${WORK_DIR}/build -G Ninja
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
if(RANKS EQUAL 0)
  run(${WORK_DIR}/build/${EXAMPLE})
else()
  run(${MPIEXEC} -n ${RANKS} --oversubscribe ${WORK_DIR}/build/${EXAMPLE})
endif()
