# The accelpool guest image (Debian's kernel + a busybox initramfs), built by build-guest.sh.
#
#   accelpool_add_guest_image(<target> OUTPUT_DIR <dir> [FILES <file[:guest path]>...] [DEPENDS <target>...])
#
# adds a custom target that (re)builds the image into <dir> when the script, /init or one of FILES changes.
# FILES may use generator expressions, e.g. $<TARGET_FILE:accelpool-guestd>; each must be statically linked.
# Name in DEPENDS the targets and files behind FILES, so the image is rebuilt when they change.
# The kernel package is downloaded with apt once into ACCELPOOL_GUEST_CACHE_DIR. Where that cannot be done
# (no network, tools missing) the build does not fail: <dir>/UNAVAILABLE says why, and the VM tests skip.
#
# Including this file also defines the target `guest-image` (the plain image, in <build>/guest-image).
include_guard(GLOBAL)

# Cache variables, so that every directory sees them (this file is included once per build).
set(ACCELPOOL_GUEST_IMAGE_SOURCE_DIR ${CMAKE_CURRENT_LIST_DIR} CACHE INTERNAL "Sources of the guest image")
set(ACCELPOOL_GUEST_CACHE_DIR "${CMAKE_BINARY_DIR}/guest-image-cache" CACHE PATH
    "Where build-guest.sh keeps the downloaded kernel package (shared by all guest images of this build)")

function(accelpool_add_guest_image target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "OUTPUT_DIR" "FILES;DEPENDS")
  if(NOT arg_OUTPUT_DIR)
    message(FATAL_ERROR "accelpool_add_guest_image(${target}): OUTPUT_DIR is required")
  endif()
  set(src ${ACCELPOOL_GUEST_IMAGE_SOURCE_DIR})
  set(stamp ${arg_OUTPUT_DIR}/.built)
  # The stamp is written only when a full image was produced, so an unavailable kernel is retried next build.
  add_custom_command(
    OUTPUT ${stamp}
    COMMAND ${CMAKE_COMMAND} -E remove -f ${stamp}
    COMMAND ${src}/build-guest.sh --soft --cache ${ACCELPOOL_GUEST_CACHE_DIR} ${arg_OUTPUT_DIR} ${arg_FILES}
    COMMAND sh -c "[ -e \"$1/UNAVAILABLE\" ] || touch \"$1/.built\"" build-guest ${arg_OUTPUT_DIR}
    DEPENDS ${src}/build-guest.sh ${src}/init ${src}/pci-event ${arg_DEPENDS}
    COMMENT "Building guest image ${arg_OUTPUT_DIR}"
    VERBATIM
  )
  add_custom_target(${target} DEPENDS ${stamp})
endfunction()

accelpool_add_guest_image(guest-image OUTPUT_DIR ${CMAKE_BINARY_DIR}/guest-image)
