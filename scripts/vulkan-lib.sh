# Shared by scripts/setup and scripts/setup-vulkan (sourced, not run): where edgespec keeps things and
# which Vulkan headers a ggml-vulkan build can use.

# The oldest Vulkan headers the vendored ggml-vulkan compiles against: it uses vk::LayerSettingEXT
# (VK_EXT_layer_settings), public in the headers since 1.3.272. Debian 12 ships 1.3.239.
VULKAN_MIN_HEADERS="1.3.272"

edgespec_home() {
  if [ -n "${EDGESPEC_HOME:-}" ]; then echo "$EDGESPEC_HOME"
  elif [ "$(uname -s)" = "Darwin" ]; then echo "$HOME/Library/Application Support/edgespec"
  else echo "${XDG_CONFIG_HOME:-$HOME/.config}/edgespec"; fi
}

# "1.3.239" for an include directory holding vulkan/vulkan_core.h; fails when there is none.
vulkan_header_version() {
  local h="$1/vulkan/vulkan_core.h"
  [ -f "$h" ] || return 1
  local patch minor
  patch=$(sed -nE 's/^#define VK_HEADER_VERSION ([0-9]+).*/\1/p' "$h" | head -1)
  minor=$(sed -nE 's/^#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION\(0, *1, *([0-9]+),.*/\1/p' "$h" | head -1)
  [ -n "$patch" ] || return 1
  echo "1.${minor:-?}.$patch"
}

# Usable = the C++ header exists and declares the layer-settings extension ggml-vulkan needs.
vulkan_headers_ok() {
  [ -f "$1/vulkan/vulkan.hpp" ] && grep -q 'VK_EXT_layer_settings' "$1/vulkan/vulkan_core.h" 2>/dev/null
}

# The include directory to build against: EDGESPEC_VULKAN_INCLUDE, else the system's when new enough,
# else the newest set scripts/setup-vulkan unpacked under $EDGESPEC_HOME/vulkan-headers.
vulkan_include_dir() {
  if [ -n "${EDGESPEC_VULKAN_INCLUDE:-}" ]; then
    vulkan_headers_ok "$EDGESPEC_VULKAN_INCLUDE" && { echo "$EDGESPEC_VULKAN_INCLUDE"; return 0; }
    return 1
  fi
  local d
  for d in /usr/include /usr/local/include; do
    vulkan_headers_ok "$d" && { echo "$d"; return 0; }
  done
  for d in $(ls -d "$(edgespec_home)"/vulkan-headers/*/usr/include 2>/dev/null | sort -rV); do
    vulkan_headers_ok "$d" && { echo "$d"; return 0; }
  done
  return 1
}
