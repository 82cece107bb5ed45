# TorchConfig.cmake for linking only the CPU part of a CUDA build of libtorch (the pip wheel's).
# scripts/cross_aarch64.sh copies it over <torch>/share/cmake/Torch/TorchConfig.cmake of the
# unpacked aarch64 wheel; nothing else uses it.
#
# Why: PyPI's aarch64 torch wheel (2.14.1) is a CUDA 13 build. Its own TorchConfig.cmake includes
# Caffe2's cuda.cmake (nvcc, CUDA headers and libraries for the target, enable_language(CUDA)),
# and its `torch` target links libtorch_cuda.so, which needs cuBLAS, cuDNN, NCCL, ... (gigabytes of
# aarch64 wheels). A cross build needs none of that for the runner's CPU path: this file gives a
# consumer what the wheel's file gives (TORCH_FOUND, TORCH_INCLUDE_DIRS, TORCH_LIBRARIES,
# TORCH_CXX_FLAGS, the imported targets torch, torch_cpu, c10) with torch = libtorch_cpu.so + libc10.so.
# libtorch_cpu.so itself still needs libcudart.so.13 and libcupti.so.13 (its profiler); the script
# puts those from the nvidia-cuda-runtime / nvidia-cuda-cupti aarch64 wheels where the wheel's
# RUNPATH looks for them (<site>/nvidia/cu13/lib), so the link closes and the binary loads.
get_filename_component(TORCH_INSTALL_PREFIX "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)   # <site>/torch
get_filename_component(_dp_site "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)

set(TORCH_INCLUDE_DIRS "${TORCH_INSTALL_PREFIX}/include"
                       "${TORCH_INSTALL_PREFIX}/include/torch/csrc/api/include")
# plain paths, not find_library: in a cross build find_library re-roots a folder that is outside
# CMAKE_FIND_ROOT_PATH below the target root
foreach(_dp_lib torch_cpu c10)
  string(TOUPPER "${_dp_lib}_LIBRARY" _dp_var)
  if(EXISTS "${TORCH_INSTALL_PREFIX}/lib/lib${_dp_lib}.so")
    set(${_dp_var} "${TORCH_INSTALL_PREFIX}/lib/lib${_dp_lib}.so")
  endif()
endforeach()
set(TORCH_LIBRARY "${TORCH_CPU_LIBRARY}")

file(GLOB _dp_cuda_libs LIST_DIRECTORIES true "${_dp_site}/nvidia/*/lib")
string(JOIN ":" _dp_rpath_link "${TORCH_INSTALL_PREFIX}/lib" ${_dp_cuda_libs})

if(TORCH_LIBRARY AND C10_LIBRARY AND NOT TARGET torch)
  add_library(c10 SHARED IMPORTED)
  set_target_properties(c10 PROPERTIES
    IMPORTED_LOCATION "${C10_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${TORCH_INSTALL_PREFIX}/include")
  add_library(torch_cpu SHARED IMPORTED)
  set_target_properties(torch_cpu PROPERTIES
    IMPORTED_LOCATION "${TORCH_LIBRARY}"
    # as the wheel's own torch_cpu target (Caffe2Targets.cmake), so headers see the same build
    INTERFACE_COMPILE_DEFINITIONS "USE_DISTRIBUTED;USE_C10D_GLOO;USE_RPC;USE_TENSORPIPE"
    INTERFACE_INCLUDE_DIRECTORIES "${TORCH_INCLUDE_DIRS}"
    # Debian's cross ld follows the libraries' RUNPATH ($ORIGIN/../../nvidia/cu13/lib) to their own
    # dependencies like a native one; other cross linkers do not: name the folders
    INTERFACE_LINK_OPTIONS "LINKER:-rpath-link,${_dp_rpath_link}"
    INTERFACE_LINK_LIBRARIES c10)
  add_library(torch INTERFACE IMPORTED)
  set_target_properties(torch PROPERTIES INTERFACE_LINK_LIBRARIES torch_cpu)
endif()
set(TORCH_LIBRARIES torch)
set(TORCH_CXX_FLAGS "")

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Torch DEFAULT_MSG TORCH_LIBRARY C10_LIBRARY TORCH_INCLUDE_DIRS)
