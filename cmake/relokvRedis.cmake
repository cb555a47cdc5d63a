# The optional Redis component: relokv::redis = relokv::relokv + hiredis + RELOKV_WITH_REDIS=1
# (which lets any_store::from_url open redis:// URLs). Defined only where hiredis is found
# (Debian: libhiredis-dev). Shared by the build (CMakeLists.txt) and by consumers that ask
# for it: find_package(relokv CONFIG COMPONENTS redis).
find_path(RELOKV_HIREDIS_INCLUDE_DIR hiredis/hiredis.h)
find_library(RELOKV_HIREDIS_LIBRARY NAMES hiredis)
if(RELOKV_HIREDIS_INCLUDE_DIR AND RELOKV_HIREDIS_LIBRARY)
  if(NOT TARGET relokv::redis)
    add_library(relokv::redis INTERFACE IMPORTED)
    set_target_properties(relokv::redis PROPERTIES
      INTERFACE_LINK_LIBRARIES "relokv::relokv;${RELOKV_HIREDIS_LIBRARY}"
      INTERFACE_COMPILE_DEFINITIONS "RELOKV_WITH_REDIS=1")
    if(NOT RELOKV_HIREDIS_INCLUDE_DIR STREQUAL "/usr/include")
      set_target_properties(relokv::redis PROPERTIES
        INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${RELOKV_HIREDIS_INCLUDE_DIR}"
        INTERFACE_INCLUDE_DIRECTORIES "${RELOKV_HIREDIS_INCLUDE_DIR}")
    endif()
  endif()
  set(relokv_redis_FOUND TRUE)
else()
  set(relokv_redis_FOUND FALSE)
endif()
