# Install + export: find_package(kshard CONFIG) gives kshard::core, kshard::mesh, kshard::kernels,
# kshard::engine, kshard::optim, kshard::checkpoint, kshard::train and kshard::testing (with
# kshard_add_distributed_suite) to outside projects.
include(CMakePackageConfigHelpers)

set(KSHARD_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kshard)
set(_targets kshard_core kshard_mesh kshard_kernels kshard_engine kshard_optim kshard_checkpoint kshard_train kshard_unit_main)
if(TARGET kshard_testing)
  list(APPEND _targets kshard_testing)
endif()
install(TARGETS ${_targets} EXPORT kshardTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET kshard_nccl)
  install(TARGETS kshard_nccl EXPORT kshardTargets)
endif()
install(EXPORT kshardTargets NAMESPACE kshard:: DESTINATION ${KSHARD_CMAKE_DIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kshardConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kshardConfig.cmake INSTALL_DESTINATION ${KSHARD_CMAKE_DIR}
  PATH_VARS CMAKE_INSTALL_BINDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kshardConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/kshardConfig.cmake
  ${PROJECT_BINARY_DIR}/kshardConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/KshardFindKokkos.cmake
  ${PROJECT_SOURCE_DIR}/cmake/KshardDistributedSuite.cmake
  DESTINATION ${KSHARD_CMAKE_DIR})
