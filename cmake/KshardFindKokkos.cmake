# Finds Kokkos and repairs the one defect of Debian's Kokkos 3.4.01 package.
# Installed with kshard and used by kshardConfig.cmake too, so that consumers
# get the same repaired target.
#
# Debian's KokkosConfig.cmake computes its install prefix one directory too
# high, so Kokkos::kokkos carries "<prefix>/lib/include", which does not exist,
# and CMake refuses to use the target. We point the include directories at the
# directory that actually holds Kokkos_Core.hpp (include/trilinos on Debian).
include_guard(GLOBAL)

# A CUDA Kokkos' config defines CUDA::cudart and CUDA::cuda_driver itself
# unless they exist, with the library paths of the machine Kokkos was built on
# (/usr/local/cuda/lib/... here). Finding the toolkit first makes those the
# targets of the toolkit this build actually uses, so a Kokkos install carried
# to another machine (ci/gpu-run) still links. nvcc_wrapper as the compiler is
# how every CUDA Kokkos 3.x build is compiled.
if(CMAKE_CXX_COMPILER MATCHES "nvcc_wrapper$")
  find_package(CUDAToolkit REQUIRED)
endif()
find_package(Kokkos REQUIRED)

function(_kshard_fix_kokkos_includes)
  set(tgt Kokkos::kokkoscore)
  if(NOT TARGET ${tgt})
    set(tgt Kokkos::kokkos)
  endif()
  foreach(t Kokkos::kokkos Kokkos::kokkoscore)
    if(NOT TARGET ${t})
      continue()
    endif()
    get_target_property(incs ${t} INTERFACE_INCLUDE_DIRECTORIES)
    if(NOT incs)
      continue()
    endif()
    set(good "")
    set(bad FALSE)
    foreach(d IN LISTS incs)
      if(d MATCHES "^\\$<" OR EXISTS "${d}")
        list(APPEND good "${d}")
      else()
        set(bad TRUE)
      endif()
    endforeach()
    if(bad)
      find_path(KSHARD_KOKKOS_INCLUDE_DIR Kokkos_Core.hpp
        PATH_SUFFIXES trilinos kokkos
        HINTS ${Kokkos_DIR}/../../../include ${Kokkos_DIR}/../../include
        REQUIRED)
      list(APPEND good "${KSHARD_KOKKOS_INCLUDE_DIR}")
      list(REMOVE_DUPLICATES good)
      set_target_properties(${t} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${good}")
    endif()
  endforeach()
endfunction()
_kshard_fix_kokkos_includes()

# One switch for the whole project: is this a Kokkos CUDA build?
set(KSHARD_KOKKOS_CUDA OFF)
if(DEFINED Kokkos_DEVICES AND "CUDA" IN_LIST Kokkos_DEVICES)
  set(KSHARD_KOKKOS_CUDA ON)
elseif(Kokkos_ENABLE_CUDA)
  set(KSHARD_KOKKOS_CUDA ON)
endif()
