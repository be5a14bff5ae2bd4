# Resolves RELAXCC_WITH_{CUDA,NCCL,TORCH} (AUTO/ON/OFF) into 0/1 variables:
#   RELAXCC_HAVE_CUDA_KERNELS  nvcc and the CUDA toolkit were found: the CUDA
#                              kernels are compiled into relaxcc::kernels
#                              (reported in the generated config.h)
#   RELAXCC_NCCL_FOUND         nccl.h and libnccl were found: the NCCL
#                              communicator is built into relaxcc::relaxcc
#                              (src/nccl; reported in config.h as
#                              RELAXCC_HAVE_NCCL)
#   RELAXCC_TORCH_FOUND        libtorch's TorchConfig.cmake was found
#   RELAXCC_UCX_FOUND          pkg-config found ucx (libucx-dev): the UCX wing
#                              (src/ucx) is built into relaxcc::relaxcc, with
#                              the imported target PkgConfig::UCX (reported in
#                              config.h as RELAXCC_HAVE_UCX)
# libtorch builds relaxcc::torch and relaxcc-train (src/torch, train).
include(CheckLanguage)

# Sets `result_var` to 1 when `found`, 0 when `opt` is OFF or when AUTO found
# nothing; ON without `found` is an error.
function(relaxcc_resolve_feature opt found result_var)
  if(${opt} STREQUAL "OFF")
    set(result 0)
  elseif(found)
    set(result 1)
  elseif(${opt} STREQUAL "ON")
    message(FATAL_ERROR "${opt}=ON but its toolchain was not found")
  else()
    set(result 0)
  endif()
  set(${result_var} ${result} PARENT_SCOPE)
endfunction()

# CUDA: nvcc from PATH or /usr/local/cuda.
set(_cuda_found FALSE)
if(NOT RELAXCC_WITH_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "nvcc")
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_ARCHITECTURES ${RELAXCC_CUDA_ARCHITECTURES})
    enable_language(CUDA)
    # CMake 3.25 knows no C++20 flag for nvcc 13: pass it ourselves, so that
    # CUDA sources compile as C++20 like the rest of relaxcc.
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    find_package(CUDAToolkit)
    if(CUDAToolkit_FOUND)
      set(_cuda_found TRUE)
    endif()
  endif()
endif()
relaxcc_resolve_feature(RELAXCC_WITH_CUDA ${_cuda_found} RELAXCC_HAVE_CUDA_KERNELS)

# NCCL: nccl.h and libnccl beside the CUDA toolkit (needs CUDA).
set(_nccl_found FALSE)
if(RELAXCC_HAVE_CUDA_KERNELS AND NOT RELAXCC_WITH_NCCL STREQUAL "OFF")
  find_path(RELAXCC_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(RELAXCC_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(RELAXCC_NCCL_INCLUDE_DIR AND RELAXCC_NCCL_LIBRARY)
    set(_nccl_found TRUE)
  endif()
endif()
relaxcc_resolve_feature(RELAXCC_WITH_NCCL ${_nccl_found} RELAXCC_NCCL_FOUND)
set(RELAXCC_HAVE_NCCL ${RELAXCC_NCCL_FOUND})  # config.h

# libtorch: Debian's libtorch-dev ships TorchConfig.cmake. Only its presence is
# probed here: loading it sets CMAKE_CUDA_STANDARD and other globals, so a
# target that uses libtorch must load it in its own directory scope.
set(_torch_found FALSE)
if(NOT RELAXCC_WITH_TORCH STREQUAL "OFF")
  find_path(RELAXCC_TORCH_CONFIG_DIR TorchConfig.cmake
            PATH_SUFFIXES lib/${CMAKE_LIBRARY_ARCHITECTURE}/cmake/Torch share/cmake/Torch)
  if(RELAXCC_TORCH_CONFIG_DIR)
    set(_torch_found TRUE)
  endif()
endif()
relaxcc_resolve_feature(RELAXCC_WITH_TORCH ${_torch_found} RELAXCC_TORCH_FOUND)

# UCX: libucx-dev's ucx.pc.
set(_ucx_found FALSE)
if(NOT RELAXCC_WITH_UCX STREQUAL "OFF")
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(UCX QUIET IMPORTED_TARGET GLOBAL ucx)
    if(UCX_FOUND)
      set(_ucx_found TRUE)
    endif()
  endif()
endif()
relaxcc_resolve_feature(RELAXCC_WITH_UCX ${_ucx_found} RELAXCC_UCX_FOUND)
set(RELAXCC_HAVE_UCX ${RELAXCC_UCX_FOUND})  # config.h
# Python: an interpreter that imports torch (Debian's python3-torch lives in
# /usr/bin/python3, which a pyenv or venv `python3` on PATH may hide), and
# pybind11's CMake package. Both found: RELAXCC_BUILD_PYTHON defaults to ON
# and builds the package in python/ (relaxcc._C needs libtorch as well).
set(_python_found FALSE)
if(RELAXCC_TORCH_FOUND)
  if(NOT RELAXCC_PYTHON_EXECUTABLE)
    find_program(_python_on_path python3)
    foreach(candidate ${_python_on_path} /usr/bin/python3)
      if(candidate AND NOT RELAXCC_PYTHON_EXECUTABLE)
        execute_process(COMMAND ${candidate} -c "import torch"
                        RESULT_VARIABLE _torch_import OUTPUT_QUIET ERROR_QUIET)
        if(_torch_import EQUAL 0)
          set(RELAXCC_PYTHON_EXECUTABLE ${candidate} CACHE FILEPATH
              "The Python interpreter (with torch) the relaxcc package is built for")
        endif()
      endif()
    endforeach()
  endif()
  if(RELAXCC_PYTHON_EXECUTABLE)
    # pybind11 finds the Python of RELAXCC_PYTHON_EXECUTABLE (FindPython).
    set(PYBIND11_FINDPYTHON ON)
    set(Python_EXECUTABLE ${RELAXCC_PYTHON_EXECUTABLE})
    find_package(pybind11 CONFIG QUIET)
  endif()
  if(RELAXCC_PYTHON_EXECUTABLE AND pybind11_FOUND)
    set(_python_found TRUE)
  endif()
endif()
option(RELAXCC_BUILD_PYTHON "Build the Python package relaxcc (python/)" ${_python_found})
if(RELAXCC_BUILD_PYTHON AND NOT _python_found)
  message(FATAL_ERROR "RELAXCC_BUILD_PYTHON=ON needs libtorch, pybind11 and a Python that imports torch")
endif()
