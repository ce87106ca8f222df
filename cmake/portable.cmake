# The portable build (DDPRUN_PORTABLE=ON, the `portable` preset, scripts/package.sh): a ddprun
# whose only run-time dependency is glibc 2.31 or newer, so that one binary runs on Debian 11
# and 12, Ubuntu 20.04 to 24.04 and Rocky 8 and 9.
#
# How: this machine's compiler (gcc 12) builds against the C library of a Debian 11 root
# (DDPRUN_SYSROOT: `debootstrap --variant=minbase --include=libc6-dev bullseye DIR`), so every
# glibc symbol the binary needs is one glibc 2.31 has; everything else is linked in:
# libstdc++ and libgcc (-static-libstdc++ -static-libgcc), Boost.Filesystem and OpenSSL's
# libcrypto (Debian's static archives), and toml++, fmt, spdlog, CLI11 and nlohmann-json in
# their header-only forms. The libraries' headers come from this machine through one staged
# folder of links, never through /usr/include itself, which would put glibc 2.36's headers
# in front of the root's.
#
# This file defines the imported targets the rest of the build links (fmt::fmt, Boost::headers,
# OpenSSL::Crypto, ...) in place of find_package's.

set(DDPRUN_SYSROOT "" CACHE PATH "A Debian 11 root with libc6-dev: the C library the portable build links")
if(NOT EXISTS "${DDPRUN_SYSROOT}/usr/include/stdio.h" OR NOT EXISTS "${DDPRUN_SYSROOT}/usr/lib/x86_64-linux-gnu/libc.so")
  message(FATAL_ERROR "DDPRUN_PORTABLE needs DDPRUN_SYSROOT: a Debian 11 root with libc6-dev "
                      "(scripts/package.sh makes one with debootstrap); got '${DDPRUN_SYSROOT}'")
endif()
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  message(FATAL_ERROR "DDPRUN_PORTABLE builds with g++ (its static libstdc++)")
endif()

set(CMAKE_SYSROOT "${DDPRUN_SYSROOT}")
# The C++ standard library's headers are this compiler's, in front of the root's C headers.
string(REGEX MATCH "^[0-9]+" ddprun_gcc_major "${CMAKE_CXX_COMPILER_VERSION}")
set(ddprun_cxx_headers /usr/include/c++/${ddprun_gcc_major}
                       /usr/include/x86_64-linux-gnu/c++/${ddprun_gcc_major}
                       /usr/include/c++/${ddprun_gcc_major}/backward)
foreach(dir IN LISTS ddprun_cxx_headers)
  if(NOT IS_DIRECTORY "${dir}")
    message(FATAL_ERROR "DDPRUN_PORTABLE: ${dir} is missing (g++ ${CMAKE_CXX_COMPILER_VERSION})")
  endif()
  add_compile_options("SHELL:-isystem ${dir}")
endforeach()

# The libraries' headers, staged as links: one folder that holds only them.
set(ddprun_staged ${CMAKE_BINARY_DIR}/portable-include)
file(MAKE_DIRECTORY ${ddprun_staged})
foreach(dir boost fmt spdlog toml++ nlohmann CLI)
  if(NOT EXISTS ${ddprun_staged}/${dir})
    file(CREATE_LINK /usr/include/${dir} ${ddprun_staged}/${dir} SYMBOLIC)
  endif()
endforeach()
file(MAKE_DIRECTORY ${ddprun_staged}/openssl)
file(GLOB ddprun_openssl_headers /usr/include/openssl/*.h /usr/include/x86_64-linux-gnu/openssl/*.h)
foreach(header IN LISTS ddprun_openssl_headers)
  get_filename_component(name ${header} NAME)
  if(NOT EXISTS ${ddprun_staged}/openssl/${name})
    file(CREATE_LINK ${header} ${ddprun_staged}/openssl/${name} SYMBOLIC)
  endif()
endforeach()

function(ddprun_header_only name)
  add_library(${name} INTERFACE IMPORTED GLOBAL)
  set_target_properties(${name} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${ddprun_staged}
                                           INTERFACE_COMPILE_DEFINITIONS "${ARGN}")
endfunction()
ddprun_header_only(fmt::fmt FMT_HEADER_ONLY=1)
ddprun_header_only(spdlog::spdlog SPDLOG_FMT_EXTERNAL FMT_HEADER_ONLY=1)
ddprun_header_only(tomlplusplus::tomlplusplus TOML_HEADER_ONLY=1)
ddprun_header_only(CLI11::CLI11)
ddprun_header_only(nlohmann_json::nlohmann_json)
ddprun_header_only(Boost::headers)

function(ddprun_static name archive)
  if(NOT EXISTS ${archive})
    message(FATAL_ERROR "DDPRUN_PORTABLE: ${archive} is missing (scripts/install-deps.sh)")
  endif()
  add_library(${name} STATIC IMPORTED GLOBAL)
  set_target_properties(${name} PROPERTIES IMPORTED_LOCATION ${archive} INTERFACE_INCLUDE_DIRECTORIES ${ddprun_staged}
                                           INTERFACE_LINK_LIBRARIES "${ARGN}")
endfunction()
set(ddprun_libs /usr/lib/x86_64-linux-gnu)
ddprun_static(Boost::atomic ${ddprun_libs}/libboost_atomic.a)
ddprun_static(Boost::filesystem ${ddprun_libs}/libboost_filesystem.a Boost::atomic)
ddprun_static(OpenSSL::Crypto ${ddprun_libs}/libcrypto.a Threads::Threads ${CMAKE_DL_LIBS})
ddprun_static(OpenSSL::SSL ${ddprun_libs}/libssl.a OpenSSL::Crypto)

# The root's C library and start files, ahead of the ones the compiler would find beside itself
# (gcc's own search path leads to this machine's /usr/lib, sysroot or not).
add_link_options(-pthread -static-libstdc++ -static-libgcc -B${DDPRUN_SYSROOT}/usr/lib/x86_64-linux-gnu
                 -L${DDPRUN_SYSROOT}/usr/lib/x86_64-linux-gnu -L${DDPRUN_SYSROOT}/lib/x86_64-linux-gnu)
