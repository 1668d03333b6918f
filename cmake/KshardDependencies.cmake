# Every third-party dependency of kshard, found in one place.
include_guard(GLOBAL)

include(KshardFindKokkos)

find_package(MPI REQUIRED COMPONENTS CXX)
find_package(fmt REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(ZLIB REQUIRED)
find_package(Boost 1.74 REQUIRED COMPONENTS program_options unit_test_framework)

if(KSHARD_KOKKOS_CUDA)
  find_package(CUDAToolkit REQUIRED)
  option(KSHARD_ENABLE_NCCL "NCCL communicator backend" ON)
else()
  set(KSHARD_ENABLE_NCCL OFF)
  # Host GEMM: OpenBLAS' CBLAS interface.
  set(BLA_VENDOR OpenBLAS)
  find_package(BLAS REQUIRED)
  find_path(KSHARD_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas openblas-pthread REQUIRED)
endif()

if(KSHARD_ENABLE_NCCL)
  find_path(KSHARD_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME PATH_SUFFIXES include REQUIRED)
  find_library(KSHARD_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_HOME PATH_SUFFIXES lib lib64 REQUIRED)
  if(NOT TARGET kshard_nccl)
    add_library(kshard_nccl INTERFACE)
    target_include_directories(kshard_nccl INTERFACE ${KSHARD_NCCL_INCLUDE_DIR})
    target_link_libraries(kshard_nccl INTERFACE ${KSHARD_NCCL_LIBRARY})
  endif()
endif()
message(STATUS "kshard: Kokkos ${Kokkos_VERSION}, CUDA=${KSHARD_KOKKOS_CUDA}, NCCL=${KSHARD_ENABLE_NCCL}")
