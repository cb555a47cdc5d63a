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

# OpenSSL's libcrypto: SHA-256 for the stored blocks' bounded identity (store/sha256.hpp) and
# AES-256-GCM with HKDF for sealed blocks (store/sealed_store.hpp). Debian: libssl-dev.
find_package(OpenSSL COMPONENTS Crypto)
if(NOT OpenSSL_FOUND OR NOT TARGET OpenSSL::Crypto)
  message(FATAL_ERROR
    "relokv needs OpenSSL's libcrypto (SHA-256, AES-GCM, HKDF). On Debian/Ubuntu: "
    "apt-get install libssl-dev; elsewhere set OPENSSL_ROOT_DIR.")
endif()
