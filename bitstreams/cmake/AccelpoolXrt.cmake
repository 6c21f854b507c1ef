# Finds XRT (Debian's libxrt-dev ships no CMake config and a broken xrt.pc) and defines two INTERFACE targets:
#   accelpool_xrt_headers  - the <xclbin.h> structs only (include path /usr/include/xrt)
#   accelpool_xrt          - headers + xrt_coreutil + uuid, for code that calls XRT
# Either is absent when XRT is not installed; users test `if(TARGET ...)`. Set ACCELPOOL_WITH_XRT=OFF to skip.
include_guard(GLOBAL)

option(ACCELPOOL_WITH_XRT "Use XRT (xclbin parsing, XRT backend) when it is installed" ON)

if(ACCELPOOL_WITH_XRT)
  find_path(ACCELPOOL_XRT_INCLUDE_DIR NAMES xrt/xrt_device.h PATH_SUFFIXES xrt)
  find_library(ACCELPOOL_XRT_COREUTIL_LIBRARY NAMES xrt_coreutil)
  find_library(ACCELPOOL_UUID_LIBRARY NAMES uuid)
  if(ACCELPOOL_XRT_INCLUDE_DIR AND EXISTS ${ACCELPOOL_XRT_INCLUDE_DIR}/xclbin.h)
    add_library(accelpool_xrt_headers INTERFACE)
    # XRT's headers warn under -Wall -Wextra; treat them as system headers.
    target_include_directories(accelpool_xrt_headers SYSTEM INTERFACE ${ACCELPOOL_XRT_INCLUDE_DIR})
    if(ACCELPOOL_XRT_COREUTIL_LIBRARY AND ACCELPOOL_UUID_LIBRARY)
      add_library(accelpool_xrt INTERFACE)
      target_link_libraries(accelpool_xrt INTERFACE accelpool_xrt_headers ${ACCELPOOL_XRT_COREUTIL_LIBRARY}
                                                    ${ACCELPOOL_UUID_LIBRARY})
      message(STATUS "accelpool: XRT found (${ACCELPOOL_XRT_INCLUDE_DIR}, ${ACCELPOOL_XRT_COREUTIL_LIBRARY})")
    endif()
  endif()
  if(NOT TARGET accelpool_xrt)
    message(STATUS "accelpool: XRT not found; xclbin metadata parsing and the XRT backend are disabled")
  endif()
endif()
