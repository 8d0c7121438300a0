# SPDX-License-Identifier: Apache-2.0
# Runs the -fno-exceptions probe with one scenario and checks how it ends (cmake -P, so no interpreter to start):
#   -DPROBE=<exe> -DSCENARIO=<name> -DEXPECT=abort -DREGEX=<re>  the process dies of SIGABRT and stderr matches REGEX
#   -DPROBE=<exe> -DSCENARIO=<name> -DEXPECT=exit0 -DREGEX=<re>  the process exits 0 and stdout matches REGEX
execute_process(COMMAND ${PROBE} ${SCENARIO} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT 60)
message("scenario ${SCENARIO}: result '${result}'\nstdout: ${out}\nstderr: ${err}")
if(EXPECT STREQUAL "abort")
  # CMake reports a child killed by SIGABRT as "Subprocess aborted" (other signals read differently).
  if(NOT result STREQUAL "Subprocess aborted")
    message(FATAL_ERROR "expected death by SIGABRT, got '${result}'")
  endif()
  if(NOT err MATCHES "${REGEX}")
    message(FATAL_ERROR "stderr does not match '${REGEX}'")
  endif()
else()
  if(NOT result STREQUAL "0" OR NOT out MATCHES "${REGEX}")
    message(FATAL_ERROR "expected exit 0 and stdout matching '${REGEX}'")
  endif()
endif()
message("PASS")
