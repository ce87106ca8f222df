# Warnings for ddprun's own targets (not for third-party headers, which come in as SYSTEM).
function(ddprun_warnings target)
  target_compile_options(${target} PRIVATE
    -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wsign-conversion
    -Wnon-virtual-dtor -Wold-style-cast -Wcast-align -Woverloaded-virtual
    -Wnull-dereference -Wdouble-promotion -Wformat=2 -Wimplicit-fallthrough)
  if(DDPRUN_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
