# Compiler settings shared by relaxcc's own targets (never by third-party code).
function(relaxcc_target_defaults target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${RELAXCC_WERROR}>>:-Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
endfunction()

# Installed libraries find their siblings, and programs find the libraries,
# without LD_LIBRARY_PATH.
set(CMAKE_INSTALL_RPATH "$ORIGIN;$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")

# Loads libtorch's TorchConfig.cmake (found by RelaxccFeatures) for the
# calling directory: its imported targets (torch, c10, ...) are visible there,
# and the variables it sets (CMAKE_CUDA_STANDARD, ...) stay inside this
# function. Link the target `torch`.
function(relaxcc_find_torch)
  find_package(Torch REQUIRED PATHS ${RELAXCC_TORCH_CONFIG_DIR} NO_DEFAULT_PATH)
endfunction()
