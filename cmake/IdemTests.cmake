# idem_discover_tests(TARGET [TEST_FILTER filter] [DISCOVERY_MODE mode]
#                     [PROPERTIES prop value ...])
#
# Registers a GoogleTest binary with CTest: one CTest test per suite, the
# suite's tests in one process, listed when ctest starts. Starting a test
# process costs more than most tests take. Measured: under ASan, the core,
# net and MCP tests (364 tests in 41 suites) took 106 s of CPU one process per
# test and 18 s one per suite; in the RelWithDebInfo build, the core tests
# (164 in 17 suites) 20.5 s of wall against 2.4 s. A suite's output names the
# test that failed.
# -DIDEM_TEST_PER_SUITE=OFF registers one CTest test per GoogleTest test
# (gtest_discover_tests), to run or time one test by its name.
#
# TEST_FILTER is a GoogleTest filter: the Redis, PostgreSQL and model tests
# use it to give each family of tests its server fixture. A suite split over
# several calls is registered once per call (NAME:Suite, NAME:Suite#2, ...).
option(IDEM_TEST_PER_SUITE "Register each GoogleTest suite, not each test, as a CTest test" ON)
set(IDEM_TEST_SUITES_SCRIPT "${CMAKE_CURRENT_LIST_DIR}/idem_test_suites.cmake")

function(idem_discover_tests target)
  cmake_parse_arguments(arg "" "TEST_FILTER;DISCOVERY_MODE" "PROPERTIES" ${ARGN})
  if(NOT IDEM_TEST_PER_SUITE)
    set(extra)
    if(arg_TEST_FILTER)
      list(APPEND extra TEST_FILTER "${arg_TEST_FILTER}")
    endif()
    if(arg_DISCOVERY_MODE)
      list(APPEND extra DISCOVERY_MODE ${arg_DISCOVERY_MODE})
    endif()
    if(arg_PROPERTIES)
      list(APPEND extra PROPERTIES ${arg_PROPERTIES})
    endif()
    gtest_discover_tests(${target} ${extra} DISCOVERY_TIMEOUT 60)
    return()
  endif()

  # One file per call: a target may be registered in parts (the Redis tests).
  get_property(calls GLOBAL PROPERTY IDEM_SUITE_CALLS_${target})
  if(NOT calls)
    set(calls 0)
  endif()
  math(EXPR calls "${calls} + 1")
  set_property(GLOBAL PROPERTY IDEM_SUITE_CALLS_${target} ${calls})
  set(include_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites_${calls}.cmake")
  string(CONCAT content
    "set(EXE [==[$<TARGET_FILE:${target}>]==])\n"
    "set(NAME [==[${target}]==])\n"
    "set(FILTER [==[${arg_TEST_FILTER}]==])\n"
    "set(PROPS [==[${arg_PROPERTIES}]==])\n"
    "set(WORKDIR [==[${CMAKE_CURRENT_BINARY_DIR}]==])\n"
    "include([==[${IDEM_TEST_SUITES_SCRIPT}]==])\n")
  file(GENERATE OUTPUT "${include_file}" CONTENT "${content}")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${include_file}")
endfunction()
