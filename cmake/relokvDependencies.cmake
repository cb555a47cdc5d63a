# Locates xxhash.h. relokv includes it with XXH_INLINE_ALL: no library to link.
# Shared by the build (CMakeLists.txt) and by consumers (relokvConfig.cmake).
find_path(RELOKV_XXHASH_INCLUDE_DIR xxhash.h)
if(NOT RELOKV_XXHASH_INCLUDE_DIR)
  message(FATAL_ERROR
    "relokv needs xxhash.h (header-only use of xxHash). On Debian/Ubuntu: "
    "apt-get install libxxhash-dev; elsewhere set RELOKV_XXHASH_INCLUDE_DIR.")
endif()
set(RELOKV_XXHASH_INCLUDE_DIR_EXTRA "")
if(NOT RELOKV_XXHASH_INCLUDE_DIR IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES
   AND NOT RELOKV_XXHASH_INCLUDE_DIR STREQUAL "/usr/include")
  set(RELOKV_XXHASH_INCLUDE_DIR_EXTRA "${RELOKV_XXHASH_INCLUDE_DIR}")
endif()
