# kshard_library(NAME <name> [SOURCES <file>...] [GLOB <dir>...]): the one
# shape of every kshard library: target kshard_<name>, aliased and exported
# as kshard::<name>, public headers under <this dir>/include (installed),
# sources listed, or globbed from <this dir>/<dir>/*.cpp for each GLOB dir
# (so that a new concept's file pair needs no CMake edit). Dependencies are
# added by the caller with target_link_libraries.
include_guard(GLOBAL)

function(kshard_library)
  cmake_parse_arguments(A "" "NAME" "SOURCES;GLOB" ${ARGN})
  set(sources ${A_SOURCES})
  foreach(dir IN LISTS A_GLOB)
    file(GLOB found CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${dir}/*.cpp)
    list(APPEND sources ${found})
  endforeach()
  set(t kshard_${A_NAME})
  add_library(${t} ${sources})
  add_library(kshard::${A_NAME} ALIAS ${t})
  set_target_properties(${t} PROPERTIES EXPORT_NAME ${A_NAME} LINKER_LANGUAGE CXX)
  target_include_directories(${t} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(${t} PUBLIC cxx_std_17)
  install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endfunction()
