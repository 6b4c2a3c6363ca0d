# dtr as a C++ library: the dtr::dtr target (every library), `cmake --install`, an exported CMake
# package and a pkg-config file.
#
#   find_package(dtr REQUIRED)                     # or: COMPONENTS tensor runtime dtensor ...
#   target_link_libraries(app PRIVATE dtr::dtr)    # or one component: dtr::tensor, dtr::models, ...
#   add_subdirectory(dtr)                          # the same targets, built with the parent
#   pkg-config --cflags --libs dtr
#
# Components (one per library, each with its usage requirements): tensor, runtime, dtensor,
# parallel, models, train (recipe / trainer of dtr-train). Installed layout: headers under
# include/dtr/<folder>/ (included as "tensor/tensor.h"), libraries in lib/, tools in bin/,
# lib/cmake/dtr/ and lib/pkgconfig/dtr.pc. Install components: dtr_libraries (shared objects),
# dtr_development (headers, CMake package, dtr.pc), dtr_tools (dtr-train, dtr-generate,
# dtr-convert, dtr-bench).
include(CMakePackageConfigHelpers)

set(DTR_COMPONENTS tensor runtime dtensor parallel models train)
foreach(c ${DTR_COMPONENTS})
  set_target_properties(dtr_${c} PROPERTIES EXPORT_NAME ${c})
  add_library(dtr::${c} ALIAS dtr_${c})
endforeach()
add_library(dtr INTERFACE)
target_link_libraries(dtr INTERFACE dtr_train dtr_models dtr_parallel dtr_dtensor dtr_runtime dtr_tensor)
add_library(dtr::dtr ALIAS dtr)

set(DTR_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/dtr)
install(TARGETS dtr dtr_tensor dtr_runtime dtr_dtensor dtr_parallel dtr_models dtr_train
  EXPORT dtrTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dtr_libraries
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dtr_development
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT dtr_libraries)
# dtr-bench's library: installed for the tool, not part of the package (it links OpenBLAS).
install(TARGETS dtr_bench LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dtr_tools)
install(TARGETS dtr-train dtr-generate dtr-convert dtr-bench
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT dtr_tools)
foreach(dir tensor runtime dtensor parallel models apps/train)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dtr/${dir}
    COMPONENT dtr_development FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")
endforeach()
install(EXPORT dtrTargets NAMESPACE dtr:: DESTINATION ${DTR_CMAKE_DIR} COMPONENT dtr_development)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/dtrConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/dtrConfig.cmake INSTALL_DESTINATION ${DTR_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/dtrConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/dtrConfig.cmake ${PROJECT_BINARY_DIR}/cmake/dtrConfigVersion.cmake
  DESTINATION ${DTR_CMAKE_DIR} COMPONENT dtr_development)

# dtr.pc: relocatable (prefix from the file's own place, so `cmake --install --prefix P` works).
# Dependencies with a .pc of their own go to Requires; MPI by its implementation's module
# (ompi-c / mpich), else by its CMake-found flags; OpenMP and CUDA as flags.
file(RELATIVE_PATH DTR_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" DTR_PC_TO_PREFIX "${DTR_PC_TO_PREFIX}")
set(DTR_PC_REQUIRES "yaml-cpp nlohmann_json")
pkg_search_module(DTR_MPI_PC QUIET ompi-c mpich mpi)
set(DTR_PC_CFLAGS "")
set(DTR_PC_LIBS "")
if(DTR_MPI_PC_FOUND)
  string(APPEND DTR_PC_REQUIRES " ${DTR_MPI_PC_MODULE_NAME}")
else()
  foreach(d ${MPI_CXX_INCLUDE_DIRS})
    string(APPEND DTR_PC_CFLAGS " -I${d}")
  endforeach()
  foreach(l ${MPI_CXX_LIBRARIES})
    string(APPEND DTR_PC_LIBS " ${l}")
  endforeach()
endif()
string(APPEND DTR_PC_CFLAGS " ${OpenMP_CXX_FLAGS}")
string(APPEND DTR_PC_LIBS " ${OpenMP_CXX_FLAGS}")
if(DTR_CUDA)
  string(APPEND DTR_PC_CFLAGS " -DDTR_WITH_CUDA=1")
  set(_dtr_cuda_includes ${CUDAToolkit_INCLUDE_DIRS} ${DTR_NCCL_INCLUDE_DIR})
  list(REMOVE_DUPLICATES _dtr_cuda_includes)
  foreach(d ${_dtr_cuda_includes})
    string(APPEND DTR_PC_CFLAGS " -I${d}")
  endforeach()
  string(APPEND DTR_PC_LIBS " -L${CUDAToolkit_LIBRARY_DIR} -lcudart")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/dtr.pc.in ${PROJECT_BINARY_DIR}/cmake/dtr.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/cmake/dtr.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
  COMPONENT dtr_development)
