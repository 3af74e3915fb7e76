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
