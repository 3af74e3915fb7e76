# What llama.cpp's CMake needs to build under meson's CMake translation
# (CMAKE_PROJECT_llama.cpp_INCLUDE: runs right after llama.cpp's project(), before its targets).

# meson's CMake translation compiles llama's unity sources *and* every src/models/*.cpp,
# which links with "multiple definition" errors; turn the unity build off once the
# target exists.
cmake_language(DEFER CALL set_target_properties llama PROPERTIES UNITY_BUILD OFF)

# meson evaluates no $<CONFIG>: ggml-vulkan's ExternalProject (the vulkan-shaders-gen tool)
# builds with "cmake --build . --config $<CONFIG>", which becomes "--config" and nothing.
# Single-configuration generators ignore --config, so drop it from the project's commands.
# ExternalProject.cmake has an include guard: ggml-vulkan's include() keeps this wrapper.
include(ExternalProject)
function(ExternalProject_Add name)
  string(REPLACE "--config;$<CONFIG>" "" args "${ARGN}")
  _ExternalProject_Add(${name} ${args})
endfunction()

# Vulkan headers older than VK_EXT_layer_settings (Debian 12: 1.3.239) cannot compile
# ggml-vulkan's instance creation: tools/vulkan_compat/vulkan/vulkan.hpp adds the extension's
# types in front of the system's vulkan.hpp (and nothing with newer headers). meson drops
# include folders outside the subproject and its build folder, so it is copied into the latter.
function(_specdec_vulkan_compat)
  if (TARGET ggml-vulkan)
    set(dir ${CMAKE_BINARY_DIR}/specdec_vulkan_compat)
    configure_file(${_specdec_tools_dir}/vulkan_compat/vulkan/vulkan.hpp
                   ${dir}/vulkan/vulkan.hpp COPYONLY)
    target_include_directories(ggml-vulkan BEFORE PRIVATE ${dir})
  endif()
endfunction()
set(_specdec_tools_dir ${CMAKE_CURRENT_LIST_DIR})
cmake_language(DEFER CALL _specdec_vulkan_compat)
