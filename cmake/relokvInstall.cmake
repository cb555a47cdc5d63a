set(RELOKV_CMAKE_DIR "${CMAKE_INSTALL_DATADIR}/cmake/relokv")

install(TARGETS relokv EXPORT relokvTargets)
install(DIRECTORY include/relokv DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
        FILES_MATCHING PATTERN "*.hpp" PATTERN "*.cuh")
install(EXPORT relokvTargets NAMESPACE relokv:: DESTINATION "${RELOKV_CMAKE_DIR}")

configure_package_config_file(cmake/relokvConfig.cmake.in
  "${PROJECT_BINARY_DIR}/relokvConfig.cmake"
  INSTALL_DESTINATION "${RELOKV_CMAKE_DIR}")
write_basic_package_version_file("${PROJECT_BINARY_DIR}/relokvConfigVersion.cmake"
  COMPATIBILITY SameMajorVersion ARCH_INDEPENDENT)
install(FILES
  "${PROJECT_BINARY_DIR}/relokvConfig.cmake"
  "${PROJECT_BINARY_DIR}/relokvConfigVersion.cmake"
  cmake/relokvDependencies.cmake
  cmake/relokvRedis.cmake
  DESTINATION "${RELOKV_CMAKE_DIR}")

# Build-tree export: find_package(relokv) with relokv_DIR=<build dir> works without installing.
export(EXPORT relokvTargets NAMESPACE relokv:: FILE "${PROJECT_BINARY_DIR}/relokvTargets.cmake")
configure_file(cmake/relokvDependencies.cmake "${PROJECT_BINARY_DIR}/relokvDependencies.cmake"
               COPYONLY)
configure_file(cmake/relokvRedis.cmake "${PROJECT_BINARY_DIR}/relokvRedis.cmake" COPYONLY)
