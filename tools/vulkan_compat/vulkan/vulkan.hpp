// Vulkan-Hpp as ggml-vulkan needs it, on Vulkan headers that predate VK_EXT_layer_settings
// (Debian 12 ships 1.3.239). ggml-vulkan always chains a VkLayerSettingsCreateInfoEXT into its
// VkInstanceCreateInfo (it only enables the validation layer with GGML_VULKAN_VALIDATE), so
// older headers fail to compile it. This adds the extension's three types with the layout and
// structure-type value of the Vulkan registry; the loader and drivers skip a pNext structure
// they do not know. With newer headers it adds nothing.
// tools/llama_under_meson.cmake puts a copy of this folder first on ggml-vulkan's include path.
#pragma once

#include_next <vulkan/vulkan.hpp>

#ifndef VK_EXT_layer_settings
#include <cstdint>
#include <vector>

namespace vk {

enum class LayerSettingTypeEXT : int32_t {
    eBool32 = 0, eInt32 = 1, eInt64 = 2, eUint32 = 3, eUint64 = 4, eFloat32 = 5, eFloat64 = 6,
    eString = 7,
};

struct LayerSettingEXT {
    const char * pLayerName;
    const char * pSettingName;
    LayerSettingTypeEXT type;
    uint32_t valueCount;
    const void * pValues;
};

struct LayerSettingsCreateInfoEXT {
    int32_t sType = 1000496000;  // VK_STRUCTURE_TYPE_LAYER_SETTINGS_CREATE_INFO_EXT
    const void * pNext = nullptr;
    uint32_t settingCount = 0;
    const LayerSettingEXT * pSettings = nullptr;

    explicit LayerSettingsCreateInfoEXT(const std::vector<LayerSettingEXT> & settings)
        : settingCount(static_cast<uint32_t>(settings.size())), pSettings(settings.data()) {}
};

}  // namespace vk
#endif
