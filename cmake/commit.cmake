# Writes OUT (generated/ddprun_build.h): the commit this binary was built from, read at every
# build (not only when CMake configures), and replaced only when it changed, so that an
# unchanged commit recompiles nothing. Run by the ddprun_build_info target (CMakeLists.txt).
#   cmake -DSOURCE=<dir> -DOUT=<file> -P cmake/commit.cmake
set(commit "unknown")
find_program(git_program git)
if(git_program AND EXISTS "${SOURCE}/.git")
  execute_process(COMMAND ${git_program} -C ${SOURCE} rev-parse --short=12 HEAD
                  OUTPUT_VARIABLE head OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE head_rc ERROR_QUIET)
  if(head_rc EQUAL 0)
    set(commit "${head}")
    execute_process(COMMAND ${git_program} -C ${SOURCE} diff --quiet HEAD -- RESULT_VARIABLE dirty_rc ERROR_QUIET)
    if(NOT dirty_rc EQUAL 0)
      set(commit "${commit}+changes")
    endif()
  endif()
endif()
file(WRITE "${OUT}.tmp" "#pragma once\n// Generated at build time by cmake/commit.cmake.\n#define DDPRUN_COMMIT \"${commit}\"\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
