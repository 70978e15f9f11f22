# libtorch for the trainer: the one inside the venv's torch wheel (torch.utils.cmake_prefix_path),
# so C++ and the workers' Python share one torch.
execute_process(COMMAND ${OPFORGE_PYTHON} -c "import torch; print(torch.utils.cmake_prefix_path)"
                OUTPUT_VARIABLE OPFORGE_TORCH_PREFIX OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE torch_rc)
if(NOT torch_rc EQUAL 0)
  message(FATAL_ERROR "the venv's python (${OPFORGE_PYTHON}) cannot import torch: run `make setup`")
endif()
# A CUDA wheel's config probes the local GPU for its arch list unless told: the CPU machines have
# none. Hopper (the H200) is what the trainer targets; the kernels themselves come with the wheel.
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(ENV{TORCH_CUDA_ARCH_LIST} "9.0")
endif()
list(APPEND CMAKE_PREFIX_PATH "${OPFORGE_TORCH_PREFIX}")
find_package(Torch REQUIRED)


# torch's include folder carries its own fmt (12), and it comes before the system folder where
# Debian's fmt 9 and the spdlog built against it live: a file including both torch and opforge's
# logging would mix the two. A folder of links to the system's fmt and spdlog, searched first,
# gives the trainer's files the same fmt as every other library of opforge (torch's public ATen
# headers do not include fmt).
get_target_property(OPFORGE_FMT_INCLUDE fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
set(OPFORGE_SYSTEM_FMT "${CMAKE_BINARY_DIR}/system_fmt")
foreach(lib fmt spdlog)
  file(MAKE_DIRECTORY "${OPFORGE_SYSTEM_FMT}")
  file(CREATE_LINK "${OPFORGE_FMT_INCLUDE}/${lib}" "${OPFORGE_SYSTEM_FMT}/${lib}" SYMBOLIC)
endforeach()
