# CMake toolchain file: build deploy_cpp for 64-bit ARM Linux (a Jetson's CPU) on an x86_64 host
# with Debian's cross compiler (apt-get install g++-aarch64-linux-gnu).
#   cmake -S deploy_cpp -B build/cross-aarch64 \
#         -DCMAKE_TOOLCHAIN_FILE=deploy_cpp/toolchains/aarch64-linux-gnu.cmake \
#         -DCMAKE_PREFIX_PATH=/path/to/aarch64/torch/share/cmake -DDEPTHPACK_OPENCV=OFF
# scripts/cross_aarch64.sh does all of it (compiler, libtorch of the aarch64 wheel, build, checks).
#
# Debian's cross gcc has its target files built in (/usr/aarch64-linux-gnu/{include,lib}), so there is
# no CMAKE_SYSROOT here: --sysroot=/usr/aarch64-linux-gnu would make gcc look for usr/include below it,
# which Debian's layout does not have. For another toolchain (a Linaro/ARM tarball, a Jetson rootfs
# copy; not tried here) set DP_CROSS_SYSROOT and, if the compiler is not on PATH as aarch64-linux-gnu-g++,
# DP_CROSS_PREFIX (e.g. /opt/gcc-arm/bin/aarch64-none-linux-gnu-).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(DP_CROSS_PREFIX "aarch64-linux-gnu-" CACHE STRING "prefix of the cross compiler's programs")
set(DP_CROSS_SYSROOT "" CACHE PATH "sysroot of the target, for toolchains without a built-in one")
set(CMAKE_C_COMPILER "${DP_CROSS_PREFIX}gcc")
set(CMAKE_CXX_COMPILER "${DP_CROSS_PREFIX}g++")

# Libraries, headers and CMake packages come from the target's root and from the prefixes given in
# CMAKE_PREFIX_PATH (the aarch64 libtorch), never from the host's /usr/lib; programs from the host.
if(DP_CROSS_SYSROOT)
  set(CMAKE_SYSROOT "${DP_CROSS_SYSROOT}")
  set(_dp_target_root "${DP_CROSS_SYSROOT}")
else()
  set(_dp_target_root /usr/aarch64-linux-gnu)
endif()
set(CMAKE_FIND_ROOT_PATH "${_dp_target_root}")
# each prefix is a root of its own, so that find_package / find_file look in it as it is instead of
# below the target root
list(APPEND CMAKE_FIND_ROOT_PATH ${CMAKE_PREFIX_PATH})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# try_run and friends run target programs through qemu-user when it is installed
find_program(DP_QEMU_AARCH64 qemu-aarch64)
if(DP_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR "${DP_QEMU_AARCH64};-L;${_dp_target_root}")
endif()
