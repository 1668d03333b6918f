# kshard_add_unit_test(NAME <name> SOURCES <src...> [LIBRARIES <lib...>] [LABELS <l...>])
#   A single-process Boost.Test executable, registered with label "unit".
include_guard(GLOBAL)

function(kshard_add_unit_test)
  cmake_parse_arguments(U "" "NAME;TIMEOUT" "SOURCES;LIBRARIES;LABELS" ${ARGN})
  if(NOT U_TIMEOUT)
    set(U_TIMEOUT 300)
  endif()
  add_executable(${U_NAME} ${U_SOURCES})
  target_link_libraries(${U_NAME} PRIVATE kshard::unit_main ${U_LIBRARIES})
  add_test(NAME ${U_NAME} COMMAND ${U_NAME} --log_level=test_suite --report_level=short)
  set_tests_properties(${U_NAME} PROPERTIES LABELS "unit;${U_LABELS}" TIMEOUT ${U_TIMEOUT})
endfunction()

# kshard_add_distributed_suite(NAME <name> SOURCES <src...> NPROCS <n>
#     [TIMEOUT <s>] [TEST_TIMEOUT <s>] [LABELS <l...>] [LIBRARIES <lib...>]
#     [ARGS <suite args...>] [ENVIRONMENT <VAR=value...>])
#   Builds a Boost.Test suite linked with kshard::testing and registers ONE
#   CTest test that runs the whole suite in ONE launch: <mpiexec> -n <n> <suite>,
#   label "distributed", PROCESSORS <n>. The launcher is the site's, from
#   CMake's FindMPI variables (see kshard_launcher_args). TIMEOUT bounds the launch (CTest);
#   TEST_TIMEOUT is the watchdog's per-test default (KSHARD_TEST_TIMEOUT).
#   NAME may also name an existing executable target (no SOURCES) to register
#   another launch of it, e.g. at a different rank count: TARGET <exe>.
if(NOT DEFINED KSHARD_RUN_SUITE)
  set(KSHARD_RUN_SUITE "${CMAKE_CURRENT_LIST_DIR}/../tests/harness/kshard-run-suite")
endif()
# kshard-launch lies next to kshard-run-suite (source tree and install).
get_filename_component(_kshard_harness_bin "${KSHARD_RUN_SUITE}" DIRECTORY)
set(KSHARD_LAUNCH "${_kshard_harness_bin}/kshard-launch" CACHE INTERNAL "")

# kshard_launcher_args(<out-var>)
#   The launcher options of kshard-run-suite and kshard-launch, from CMake's
#   standard FindMPI variables, so a site sets its launcher once (cache or
#   preset): MPIEXEC_EXECUTABLE (default mpiexec), MPIEXEC_NUMPROC_FLAG
#   (default -n), MPIEXEC_PREFLAGS (before the program) and MPIEXEC_POSTFLAGS
#   (after it). The flags may be given as a string ("--mpi=pmix -K") or as a
#   ;-list. They are read from the caller's scope, so a directory may set
#   them for its own tests only.
function(kshard_launcher_args out)
  set(exec "${MPIEXEC_EXECUTABLE}")
  if(NOT exec)
    set(exec mpiexec)
  endif()
  set(npflag "${MPIEXEC_NUMPROC_FLAG}")
  if(NOT npflag)
    set(npflag -n)
  endif()
  set(args "--mpiexec=${exec}" "--numproc-flag=${npflag}")
  foreach(kind PRE POST)
    set(flags "${MPIEXEC_${kind}FLAGS}")
    if(NOT flags MATCHES ";")
      separate_arguments(flags UNIX_COMMAND "${flags}")
    endif()
    string(TOLOWER "${kind}" k)
    foreach(f IN LISTS flags)
      # --opt=value: the value may itself start with '-'.
      list(APPEND args "--${k}flag=${f}")
    endforeach()
  endforeach()
  set(${out} "${args}" PARENT_SCOPE)
endfunction()

function(kshard_add_distributed_suite)
  cmake_parse_arguments(S "" "NAME;TARGET;NPROCS;TIMEOUT;TEST_TIMEOUT"
                        "SOURCES;LABELS;LIBRARIES;ARGS;ENVIRONMENT" ${ARGN})
  if(NOT S_NAME OR NOT S_NPROCS)
    message(FATAL_ERROR "kshard_add_distributed_suite: NAME and NPROCS are required")
  endif()
  if(NOT S_TIMEOUT)
    set(S_TIMEOUT 600)
  endif()
  if(NOT S_TEST_TIMEOUT)
    set(S_TEST_TIMEOUT 60)
  endif()
  set(target ${S_TARGET})
  if(NOT target)
    set(target ${S_NAME})
    add_executable(${target} ${S_SOURCES})
    target_link_libraries(${target} PRIVATE kshard::testing ${S_LIBRARIES})
  endif()
  kshard_launcher_args(launch)
  add_test(NAME ${S_NAME}
    COMMAND ${KSHARD_RUN_SUITE} --np ${S_NPROCS}
            --logs ${CMAKE_CURRENT_BINARY_DIR}/${S_NAME}.logs
            ${launch} --test-timeout ${S_TEST_TIMEOUT}
            --hard-timeout ${S_TIMEOUT}
            -- $<TARGET_FILE:${target}> ${S_ARGS})
  set_tests_properties(${S_NAME} PROPERTIES
    LABELS "distributed;${S_LABELS}"
    PROCESSORS ${S_NPROCS}
    TIMEOUT ${S_TIMEOUT}
    ENVIRONMENT "${S_ENVIRONMENT}")
endfunction()
