# meson's CMake translation compiles llama's unity sources *and* every src/models/*.cpp,
# which links with "multiple definition" errors; turn the unity build off once the
# target exists (CMAKE_PROJECT_<name>_INCLUDE runs before the targets are defined).
cmake_language(DEFER CALL set_target_properties llama PROPERTIES UNITY_BUILD OFF)
