# Every third-party dependency of kshard, found in one place.
include_guard(GLOBAL)

include(KshardFindKokkos)

find_package(MPI REQUIRED COMPONENTS CXX)
find_package(nlohmann_json 3 REQUIRED)
find_package(ZLIB REQUIRED)
find_package(Threads REQUIRED)  # the asynchronous checkpoint writer
find_package(Boost 1.74 REQUIRED COMPONENTS unit_test_framework OPTIONAL_COMPONENTS program_options)

# A Kokkos 3.x CUDA build under CUDA >= 12 only compiles with our compat header
# force-included, and only runs on sm_90 (H100/H200) with sm_90 SASS added
# through NVCC_APPEND_FLAGS (see presets/cuda.json and ../shared/TOOLCHAIN.md).
# Say so at configure time rather than with a wall of nvcc errors.
function(kshard_check_cuda_recipe)
  if(Kokkos_VERSION VERSION_GREATER_EQUAL 4.0 OR CUDAToolkit_VERSION VERSION_LESS 12.0)
    return()
  endif()
  if(NOT CMAKE_CXX_FLAGS MATCHES "-include[ =]*[^ ]*kshard/compat/cuda13_kokkos\\.hpp")
    message(FATAL_ERROR "kshard: Kokkos ${Kokkos_VERSION} with CUDA ${CUDAToolkit_VERSION} needs "
      "'-include <kshard>/core/include/kshard/compat/cuda13_kokkos.hpp' in CMAKE_CXX_FLAGS "
      "(CMAKE_CXX_FLAGS is '${CMAKE_CXX_FLAGS}'); use the cuda preset")
  endif()
  if(NOT CMAKE_CXX_COMPILER_LAUNCHER MATCHES "NVCC_APPEND_FLAGS=.*sm_90" OR
     NOT CMAKE_CXX_LINKER_LAUNCHER MATCHES "NVCC_APPEND_FLAGS=.*sm_90")
    message(WARNING "kshard: no sm_90 SASS requested (CMAKE_CXX_COMPILER_LAUNCHER and "
      "CMAKE_CXX_LINKER_LAUNCHER without NVCC_APPEND_FLAGS=...sm_90): Kokkos::Cuda::initialize "
      "aborts on H100/H200 GPUs. The cuda preset sets both.")
  endif()
endfunction()

if(KSHARD_KOKKOS_CUDA)
  # Kokkos' config has already defined CUDA::cudart and CUDA::cuda_driver
  # (imported, pointing into the toolkit it was built with); FindCUDAToolkit
  # keeps those and adds the rest (CUDA::cublas for the engine).
  find_package(CUDAToolkit REQUIRED)
  option(KSHARD_ENABLE_NCCL "NCCL communicator backend" ON)
  kshard_check_cuda_recipe()
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
  file(STRINGS "${KSHARD_NCCL_INCLUDE_DIR}/nccl.h" _nccl_defs REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  set(KSHARD_NCCL_VERSION "")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${_part} +([0-9]+)" _m "${_nccl_defs}")
    list(APPEND KSHARD_NCCL_VERSION "${CMAKE_MATCH_1}")
  endforeach()
  list(JOIN KSHARD_NCCL_VERSION "." KSHARD_NCCL_VERSION)
  # ncclAvg and ncclBfloat16 (mesh/src/nccl/nccl_comm.cpp) appeared in 2.10.
  if(KSHARD_NCCL_VERSION VERSION_LESS 2.10)
    message(FATAL_ERROR "kshard: NCCL ${KSHARD_NCCL_VERSION} at ${KSHARD_NCCL_INCLUDE_DIR} is too old; "
                        "the NCCL backend needs >= 2.10 (or configure with -DKSHARD_ENABLE_NCCL=OFF)")
  endif()
endif()
# cuDNN's fused attention (kernels/src/cuda/flash_attention_cudnn.cpp) through
# the header-only cuDNN frontend (ci/cudnn-frontend installs its headers into
# .deps/cudnn-frontend). Optional: without it the bf16/f16 attention runs on
# kshard's own tensor-core kernel.
if(KSHARD_KOKKOS_CUDA)
  option(KSHARD_ENABLE_CUDNN "cuDNN fused attention (needs the cuDNN frontend headers)" ON)
  set(KSHARD_CUDNN_FRONTEND_DIR "" CACHE PATH "prefix holding include/cudnn_frontend.h")
  if(KSHARD_ENABLE_CUDNN)
    find_path(KSHARD_CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h
      HINTS ${KSHARD_CUDNN_FRONTEND_DIR} ${PROJECT_SOURCE_DIR}/.deps/cudnn-frontend ENV CUDNN_FRONTEND_HOME
      PATH_SUFFIXES include NO_DEFAULT_PATH)
    # cuDNN's headers: ci/cudnn-frontend's (the oldest cuDNN 9 for CUDA 13, so
    # that any newer runtime serves; see there) before the toolkit's.
    find_path(KSHARD_CUDNN_INCLUDE_DIR cudnn.h
      HINTS ${KSHARD_CUDNN_FRONTEND_DIR}/cudnn ${PROJECT_SOURCE_DIR}/.deps/cudnn-frontend/cudnn
            ${CUDAToolkit_INCLUDE_DIRS}
      PATH_SUFFIXES include)
    find_library(KSHARD_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR})
    if(KSHARD_CUDNN_FRONTEND_INCLUDE_DIR AND KSHARD_CUDNN_INCLUDE_DIR AND KSHARD_CUDNN_LIBRARY AND TARGET CUDA::nvrtc)
      set(KSHARD_HAVE_CUDNN ON)
      file(STRINGS ${KSHARD_CUDNN_INCLUDE_DIR}/cudnn_version.h _kshard_cudnn_v REGEX "^#define CUDNN_(MAJOR|MINOR) ")
      string(REGEX REPLACE "[^0-9;]" "" _kshard_cudnn_v "${_kshard_cudnn_v}")
      list(JOIN _kshard_cudnn_v "." _kshard_cudnn_v)
      message(STATUS "kshard: cuDNN fused attention ON (frontend ${KSHARD_CUDNN_FRONTEND_INCLUDE_DIR}, "
                     "cuDNN ${_kshard_cudnn_v} headers ${KSHARD_CUDNN_INCLUDE_DIR}: runs on libcudnn >= ${_kshard_cudnn_v}; "
                     "${KSHARD_CUDNN_LIBRARY})")
    else()
      set(KSHARD_HAVE_CUDNN OFF)
      message(STATUS "kshard: cuDNN fused attention OFF (run ci/cudnn-frontend for the frontend headers; "
                     "frontend '${KSHARD_CUDNN_FRONTEND_INCLUDE_DIR}', cudnn.h '${KSHARD_CUDNN_INCLUDE_DIR}', "
                     "library '${KSHARD_CUDNN_LIBRARY}')")
    endif()
  endif()
endif()

if(KSHARD_ENABLE_NCCL)
  message(STATUS "kshard: Kokkos ${Kokkos_VERSION}, CUDA=ON (toolkit ${CUDAToolkit_VERSION}), NCCL=ON (${KSHARD_NCCL_VERSION}, ${KSHARD_NCCL_LIBRARY})")
elseif(KSHARD_KOKKOS_CUDA)
  message(STATUS "kshard: Kokkos ${Kokkos_VERSION}, CUDA=ON (toolkit ${CUDAToolkit_VERSION}), NCCL=OFF")
else()
  message(STATUS "kshard: Kokkos ${Kokkos_VERSION}, CUDA=OFF, NCCL=OFF")
endif()
