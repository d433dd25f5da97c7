# cmake --install: the public headers, the libraries (static), the binaries and a CMake package,
# so that a user's own project does
#   find_package(Cohort REQUIRED)
#   target_link_libraries(my_server PRIVATE Cohort::server)
# Included last by the top-level CMakeLists.txt, once every target exists.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(COHORT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/Cohort)
# Cohort_PLUGIN_ABI in the package is the header's kPluginAbi.
file(STRINGS ${PROJECT_SOURCE_DIR}/aggregation/include/cohort/aggregation/plugin.h
  COHORT_PLUGIN_ABI_LINE REGEX "kPluginAbi = [0-9]+")
string(REGEX MATCH "kPluginAbi = ([0-9]+)" COHORT_PLUGIN_ABI_LINE "${COHORT_PLUGIN_ABI_LINE}")
set(COHORT_PLUGIN_ABI ${CMAKE_MATCH_1})

# Library targets, exported as Cohort::<name>. cohort_warnings and cohort_options are INTERFACE
# targets the libraries link (options carries -march=native and sanitizer flags, which the
# consumer's link must repeat); transport_security and checkpoint are static libraries the
# public ones link privately, so a consumer's link needs them too. rules, compression, privacy,
# selection and collectives are the libraries under aggregation/ that cohort_aggregation links
# publicly (aggregation/CMakeLists.txt).
set(COHORT_EXPORTED_LIBRARIES
  warnings options core transport_security transport kernels observe
  rules compression privacy selection collectives aggregation checkpoint server client)
foreach(name IN LISTS COHORT_EXPORTED_LIBRARIES)
  set_target_properties(cohort_${name} PROPERTIES EXPORT_NAME ${name})
endforeach()
list(TRANSFORM COHORT_EXPORTED_LIBRARIES PREPEND cohort_ OUTPUT_VARIABLE COHORT_EXPORTED_TARGETS)
# transport/security/ sets only its build-tree include directory.
target_include_directories(cohort_transport_security PUBLIC
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

install(TARGETS ${COHORT_EXPORTED_TARGETS} EXPORT CohortTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# The binaries; the ones built in this tree are exported as Cohort::cohort-server etc., so that a
# user's tests can name them with $<TARGET_FILE:Cohort::cohort-server>.
foreach(bin cohort-server cohort-client cohort-keygen cohort-sim cohort-decentralized-sim)
  if(TARGET ${bin})
    # Keep the RUNPATH to non-system library folders (the CUDA toolkit's) after installation.
    set_target_properties(${bin} PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
    install(TARGETS ${bin} EXPORT CohortTargets RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()

# Every public header folder: <folder>/include/cohort/<name>/... lands in include/cohort/<name>/...
# (aggregation's subfolders all hold include/cohort/aggregation/).
foreach(dir core transport transport/security kernels observe
    aggregation aggregation/rules aggregation/compression aggregation/privacy aggregation/selection
    aggregation/collectives server server/checkpoint client)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
    FILES_MATCHING PATTERN "*.h")
endforeach()
# The wire format, for tools in other languages.
install(FILES ${PROJECT_SOURCE_DIR}/transport/schema/cohort.capnp
  DESTINATION ${CMAKE_INSTALL_DATADIR}/cohort/schema)

install(EXPORT CohortTargets NAMESPACE Cohort:: DESTINATION ${COHORT_INSTALL_CMAKEDIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/CohortConfig.cmake.in
  ${PROJECT_BINARY_DIR}/CohortConfig.cmake INSTALL_DESTINATION ${COHORT_INSTALL_CMAKEDIR})
# 0.x: a minor version may change the API and the plug-in ABI.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/CohortConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/CohortConfig.cmake ${PROJECT_BINARY_DIR}/CohortConfigVersion.cmake
  DESTINATION ${COHORT_INSTALL_CMAKEDIR})
