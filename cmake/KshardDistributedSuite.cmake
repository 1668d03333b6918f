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
