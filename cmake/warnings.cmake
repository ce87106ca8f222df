# Warnings for ddprun's own targets (not for third-party headers, which come in as SYSTEM).
function(ddprun_warnings target)
  target_compile_options(${target} PRIVATE
    -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wsign-conversion
    -Wnon-virtual-dtor -Wold-style-cast -Wcast-align -Woverloaded-virtual
    -Wdouble-promotion -Wformat=2 -Wimplicit-fallthrough)
  # GCC 12 reports std::variant members "maybe uninitialized" at -O2 (a known false positive,
  # GCC bugs 105593 and 107138); it would turn every optimised -Werror build red.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE -Wno-maybe-uninitialized)
  endif()
  if(DDPRUN_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
