# relaxcc_add_mpi_test(<target> SOURCES ... RANKS 1 2 3 4 [QUICK_RANKS n] [TIMEOUT s] [LIBS ...]
#                      [NO_PCH] [ENV ...] [MPIEXEC_ARGS ...] [ARGS ...])
# relaxcc_add_mpi_test(<target> REUSE SUFFIX <s> RANKS ... [QUICK_RANKS n] [ENV ...]
#                      [MPIEXEC_ARGS ...] [ARGS ...])
#   registers more entries "<target>.<s>.np<N>" for a program built already.
#
# Builds one GoogleTest program with the MPI-aware main and registers one CTest
# entry per rank count, "<target>.np<N>", run as
#   mpiexec -n N --oversubscribe --bind-to none <MPIEXEC_ARGS> <program> <ARGS>
# Each entry reserves N processors; entries with 4 or more ranks run serially.
# The gtest cases run inside one mpiexec: they are not discovered one by one.
# The entries whose rank count is in QUICK_RANKS (each one of RANKS) also
# carry the label "quick", the inner-loop tier (`ctest -L quick`).
#
# With RELAXCC_TEST_PCH on, the programs share one precompiled header
# (relaxcc_test_pch_headers): the first program builds it, the others reuse it,
# which needs the same compile flags and definitions. NO_PCH: a program whose
# libraries add definitions (libtorch) parses its headers itself.
set(RELAXCC_TEST_PCH AUTO CACHE STRING
    "Precompiled header for the test programs (AUTO: on without a compiler launcher; ON; OFF)")
set_property(CACHE RELAXCC_TEST_PCH PROPERTY STRINGS AUTO ON OFF)
# AUTO is off under a launcher: ccache caches no translation unit that uses a
# precompiled header (unless its sloppiness allows it), and a cache hit is cheaper.
if(RELAXCC_TEST_PCH STREQUAL "AUTO")
  if(CMAKE_CXX_COMPILER_LAUNCHER)
    set(relaxcc_test_pch OFF)
  else()
    set(relaxcc_test_pch ON)
  endif()
else()
  set(relaxcc_test_pch ${RELAXCC_TEST_PCH})
endif()
set(relaxcc_test_pch_headers <mpi.h> <gtest/gtest.h> <algorithm> <chrono> <cmath> <cstdint>
    <cstring> <functional> <memory> <random> <string> <thread> <vector> "test_util.h")

function(relaxcc_add_mpi_test target)
  cmake_parse_arguments(ARG "REUSE;NO_PCH" "TIMEOUT;SUFFIX" "SOURCES;RANKS;QUICK_RANKS;LIBS;ENV;MPIEXEC_ARGS;ARGS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  if(NOT ARG_REUSE)
    add_executable(${target} ${ARG_SOURCES})
    relaxcc_target_defaults(${target})
    target_link_libraries(${target} PRIVATE relaxcc_mpi_test_main ${ARG_LIBS})
    if(relaxcc_test_pch AND NOT ARG_NO_PCH)
      get_property(owner GLOBAL PROPERTY RELAXCC_TEST_PCH_OWNER)
      if(owner)
        target_precompile_headers(${target} REUSE_FROM ${owner})
      else()
        target_precompile_headers(${target} PRIVATE ${relaxcc_test_pch_headers})
        set_property(GLOBAL PROPERTY RELAXCC_TEST_PCH_OWNER ${target})
      endif()
    endif()
  endif()
  foreach(n IN LISTS ARG_QUICK_RANKS)
    if(NOT n IN_LIST ARG_RANKS)
      message(FATAL_ERROR "relaxcc_add_mpi_test(${target}): QUICK_RANKS ${n} is not one of RANKS")
    endif()
  endforeach()
  set(prefix ${target})
  if(ARG_SUFFIX)
    set(prefix ${target}.${ARG_SUFFIX})
  endif()
  foreach(n IN LISTS ARG_RANKS)
    set(name ${prefix}.np${n})
    set(labels mpi np${n})
    if(n IN_LIST ARG_QUICK_RANKS)
      list(APPEND labels quick)
    endif()
    add_test(NAME ${name}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} --oversubscribe
                     --bind-to none ${ARG_MPIEXEC_ARGS} $<TARGET_FILE:${target}> ${ARG_ARGS})
    set_tests_properties(${name} PROPERTIES
      PROCESSORS ${n} TIMEOUT ${ARG_TIMEOUT} LABELS "${labels}"
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;${ARG_ENV}")
    if(n GREATER_EQUAL 4)
      set_tests_properties(${name} PROPERTIES RUN_SERIAL TRUE)
    endif()
  endforeach()
endfunction()
