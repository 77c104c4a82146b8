#!/usr/bin/env bash
# The custom-op library for aarch64 (the ARM boards' hosts), built and run on an x86 Debian machine with
# Debian's and PyPI's packages only (docs/install.md, "aarch64"):
#
#   bash tools/aarch64.sh stage           the cross compiler (apt-get install g++-aarch64-linux-gnu), Debian
#                                         trixie's static qemu-aarch64 (extracted, not installed), an arm64
#                                         Python 3.11 sysroot and the aarch64 wheels of onnxruntime and numpy
#   bash tools/aarch64.sh build           the library cross-compiled into DIR/lib (CUDA off)
#   bash tools/aarch64.sh python ARG...   the arm64 Python under emulation, with those wheels
#   bash tools/aarch64.sh wheel           the package as a wheel for aarch64 (DIR/dist), cross-built by pip, then
#                                         installed with its dependencies' aarch64 wheels into DIR/board, as pip
#                                         on a board installs it
#   bash tools/aarch64.sh board ARG...    the arm64 Python under emulation with DIR/board alone: the board
#
# DIR is $AARCH64_DIR, by default build/aarch64. Each step of `stage` is skipped when its result is
# there. Debian 12's own
# qemu-user-static (7.2) crashes when onnxruntime's aarch64 wheel is imported; trixie's (10.0) does not.
# CI runs stage and build, then tests/test_aarch64.py runs the library under emulation.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
command=${1:?usage: tools/aarch64.sh stage|build|python|wheel|board [ARG...]}
shift
dir=${AARCH64_DIR:-$root/build/aarch64}
ort_version=1.31.1
download=$root/custom_ops/cmake/debian_download.sh

# The platforms pip may take aarch64 wheels for: the arm64 Python here is Debian 12's (glibc 2.36).
platforms=()
for glibc in 36 35 34 31 28 27 26 24 17; do platforms+=(--platform "manylinux_2_${glibc}_aarch64"); done
platforms+=(--platform manylinux2014_aarch64 --platform linux_aarch64 --platform any)
for_arm64=(--only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none
           "${platforms[@]}")

stage() {
    mkdir -p "$dir"
    if ! command -v aarch64-linux-gnu-g++ >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends g++-aarch64-linux-gnu \
            || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                 g++-aarch64-linux-gnu; }
    fi
    if [ ! -x "$dir/qemu/qemu-aarch64" ]; then
        sh "$download" trixie amd64 "$dir/debs/qemu" qemu-user
        rm -rf "$dir/qemu.tmp" && dpkg-deb -x "$dir"/debs/qemu/qemu-user_*.deb "$dir/qemu.tmp"
        mkdir -p "$dir/qemu" && mv "$dir/qemu.tmp/usr/bin/qemu-aarch64" "$dir/qemu/" && rm -rf "$dir/qemu.tmp"
    fi
    if [ ! -x "$dir/sysroot/usr/bin/python3.11" ]; then
        sh "$download" system arm64 "$dir/debs/arm64" python3.11-minimal libpython3.11-minimal \
            libpython3.11-stdlib libc6 libexpat1 zlib1g libssl3 libffi8 libbz2-1.0 liblzma5 libsqlite3-0 \
            libstdc++6 libgcc-s1 libuuid1 libncursesw6 libtinfo6 libreadline8 libdb5.3 libgdbm6 libnsl2 \
            libtirpc3 libcrypt1 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 \
            libcom-err2 media-types
        rm -rf "$dir/sysroot.tmp"
        for deb in "$dir"/debs/arm64/*.deb; do dpkg-deb -x "$deb" "$dir/sysroot.tmp"; done
        rm -rf "$dir/sysroot" && mv "$dir/sysroot.tmp" "$dir/sysroot"
    fi
    if [ "$(cat "$dir/site/.stamp" 2>/dev/null)" != "onnxruntime $ort_version" ]; then
        rm -rf "$dir/wheels" "$dir/site" && mkdir -p "$dir/wheels" "$dir/site"
        python3 -m pip download -q --disable-pip-version-check --no-deps "${for_arm64[@]}" -d "$dir/wheels" \
            "onnxruntime==$ort_version" numpy protobuf flatbuffers packaging
        for wheel in "$dir"/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$dir/site"; done
        echo "onnxruntime $ort_version" > "$dir/site/.stamp"
    fi
    echo "staged in $dir: $("$dir/qemu/qemu-aarch64" --version | head -1), $(aarch64-linux-gnu-g++ --version | head -1)"
}

build() {
    mkdir -p "$dir"
    cmake -S "$root" -B "$dir/cmake" -DCMAKE_TOOLCHAIN_FILE="$root/custom_ops/cmake/toolchain-aarch64.cmake" \
        -DCMAKE_BUILD_TYPE=Release -DSPARSE_LOWER_CUDA=OFF > "$dir/cmake.log"
    cmake --build "$dir/cmake" --target sparse_lower_ops -j2 >> "$dir/cmake.log"
    mkdir -p "$dir/lib" && cp "$dir/cmake/libsparse_lower_ops.so" "$dir/lib/"
    echo "built $dir/lib/libsparse_lower_ops.so: $(file -b "$dir/lib/libsparse_lower_ops.so" | cut -d, -f1-2)"
}

wheel() {
    # scikit-build-core takes the platform tag from _PYTHON_HOST_PLATFORM, CMake the cross compiler from
    # CMAKE_TOOLCHAIN_FILE; the build tree is build/py3-none-linux_aarch64, beside the x86 one. Without build
    # isolation: in an isolated build pip would fetch the build tools for aarch64 too.
    python3 -m pip install -q --disable-pip-version-check "scikit-build-core>=0.11" "cmake>=3.21"
    rm -rf "$dir/dist" "$dir/board" && mkdir -p "$dir/dist"
    CMAKE_TOOLCHAIN_FILE="$root/custom_ops/cmake/toolchain-aarch64.cmake" _PYTHON_HOST_PLATFORM=linux-aarch64 \
        SPARSE_LOWER_CUDA=OFF python3 -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
        -w "$dir/dist" "$root"
    python3 -m pip install -q --disable-pip-version-check --no-warn-conflicts --target "$dir/board" "${for_arm64[@]}" \
        "$dir"/dist/*.whl
    echo "built $(basename "$dir"/dist/*.whl), installed for aarch64 with its dependencies in $dir/board"
}

python() {
    # -L: the sysroot holds the arm64 loader and libraries; PYTHONHOME its standard library
    # QEMU_CPU picks the emulated CPU (qemu-aarch64 -cpu help), and with it the kernels' paths; the
    # library's SPARSE_LOWER_* switches pass through.
    env -i PATH=/usr/bin:/bin HOME="$HOME" LANG=C.UTF-8 PYTHONHOME="$dir/sysroot/usr" PYTHONPATH="${site:-$dir/site}" \
        PYTHONDONTWRITEBYTECODE=1 OPENBLAS_NUM_THREADS=1 ${QEMU_CPU:+QEMU_CPU="$QEMU_CPU"} \
        $(env | grep -o '^SPARSE_LOWER_[A-Z0-9_]*=.*' || true) \
        "$dir/qemu/qemu-aarch64" -L "$dir/sysroot" "$dir/sysroot/usr/bin/python3.11" "$@"
}

case $command in
    stage) stage ;;
    build) build ;;
    python) python "$@" ;;
    wheel) wheel ;;
    board) site=$dir/board python "$@" ;;
    *) echo "usage: tools/aarch64.sh stage|build|python|wheel|board [ARG...]" >&2; exit 2 ;;
esac
