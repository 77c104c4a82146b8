# Finds the onnxruntime C/C++ API headers and sets ORT_INCLUDE_DIR, trying in order:
#   1. ORT_INCLUDE_DIR given by the user, as a CMake variable or an environment variable;
#   2. the system include directories (e.g. /usr/include/onnxruntime from libonnxruntime-dev);
#   3. the headers of Debian's libonnxruntime-dev (suite trixie, onnxruntime 1.21), fetched through this
#      system's apt configuration by fetch_ort_headers.sh and cached under
#      ${XDG_CACHE_HOME:-~/.cache}/sparse_lower/onnxruntime-1.21-headers, so later builds skip the download.
# The PyPI wheels of onnxruntime ship no headers. The library only compiles against them: onnxruntime
# passes its API in at run time, and headers of API version N load in every onnxruntime >= 1.N.

set(ORT_INCLUDE_DIR "$ENV{ORT_INCLUDE_DIR}" CACHE PATH "Directory holding onnxruntime_cxx_api.h")

set(_ort_help "Set ORT_INCLUDE_DIR (environment or -DORT_INCLUDE_DIR=...) to a directory holding onnxruntime_cxx_api.h, e.g. the include/ of an onnxruntime release archive (1.21 recommended: the library then loads in every onnxruntime >= 1.21).")

if(ORT_INCLUDE_DIR)
  if(NOT EXISTS "${ORT_INCLUDE_DIR}/onnxruntime_cxx_api.h")
    message(FATAL_ERROR "ORT_INCLUDE_DIR=${ORT_INCLUDE_DIR} holds no onnxruntime_cxx_api.h. ${_ort_help}")
  endif()
  set(_ort_origin "ORT_INCLUDE_DIR")
else()
  find_path(_ort_system_dir onnxruntime_cxx_api.h PATH_SUFFIXES onnxruntime NO_CACHE)
  if(_ort_system_dir)
    set(ORT_INCLUDE_DIR "${_ort_system_dir}")
    set(_ort_origin "the system include directories")
  else()
    if(DEFINED ENV{XDG_CACHE_HOME} AND NOT "$ENV{XDG_CACHE_HOME}" STREQUAL "")
      set(_ort_cache "$ENV{XDG_CACHE_HOME}")
    else()
      set(_ort_cache "$ENV{HOME}/.cache")
    endif()
    set(ORT_INCLUDE_DIR "${_ort_cache}/sparse_lower/onnxruntime-1.21-headers")
    set(_ort_origin "the cache of Debian's libonnxruntime-dev")
    if(NOT EXISTS "${ORT_INCLUDE_DIR}/onnxruntime_cxx_api.h")
      message(STATUS "onnxruntime headers: fetching Debian's libonnxruntime-dev into ${ORT_INCLUDE_DIR}")
      execute_process(
        COMMAND sh "${CMAKE_CURRENT_LIST_DIR}/fetch_ort_headers.sh" "${ORT_INCLUDE_DIR}"
        RESULT_VARIABLE _ort_fetch_result
        OUTPUT_VARIABLE _ort_fetch_output
        ERROR_VARIABLE _ort_fetch_output)
      if(NOT _ort_fetch_result EQUAL 0)
        message(FATAL_ERROR "onnxruntime C/C++ API headers not found: none given, none in the system include "
                            "directories, and fetching Debian's libonnxruntime-dev failed:\n${_ort_fetch_output}\n"
                            "${_ort_help}")
      endif()
    endif()
  endif()
endif()

# The library needs API version 17 (KernelContext_ParallelFor, shape inference); headers newer than the
# oldest onnxruntime the package supports make the library refuse to load in older ones.
file(STRINGS "${ORT_INCLUDE_DIR}/onnxruntime_c_api.h" _ort_version_line REGEX "^#define ORT_API_VERSION [0-9]+")
string(REGEX REPLACE "^#define ORT_API_VERSION ([0-9]+).*" "\\1" ORT_API_VERSION "${_ort_version_line}")
if(NOT ORT_API_VERSION OR ORT_API_VERSION LESS 17)
  message(FATAL_ERROR "The onnxruntime headers in ${ORT_INCLUDE_DIR} have API version '${ORT_API_VERSION}'; "
                      "17 or later is needed. ${_ort_help}")
endif()
if(ORT_API_VERSION GREATER 21)
  message(WARNING "The onnxruntime headers in ${ORT_INCLUDE_DIR} have API version ${ORT_API_VERSION}: the "
                  "library will load only in onnxruntime >= 1.${ORT_API_VERSION} (1.21 headers load in all).")
endif()
message(STATUS "onnxruntime headers: ${ORT_INCLUDE_DIR} (API version ${ORT_API_VERSION}, from ${_ort_origin})")
