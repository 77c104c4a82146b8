#!/usr/bin/env bash
# Runs the custom-op library, and the CUDA kernels' bodies in the emulated library, under AddressSanitizer +
# UndefinedBehaviorSanitizer. It builds the library with
# -DSPARSE_LOWER_SANITIZE=ON into build/sanitize/ (git-ignored; the installed library is left alone), then
# runs the tests that execute the ops with SPARSE_LOWER_LIBRARY pointing at it. Any ASan or UBSan report
# ends the test process with a non-zero status, so the script fails. Why: the kernels index raw buffers
# with computed offsets, and an out-of-bounds access or an overflow may go unnoticed in a test that passes.
# Needs g++ (with libasan and libubsan: Debian's build-essential), cmake and the test dependencies
# (pip install ".[test]"). Usage: tools/sanitize.sh [extra pytest arguments]
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
build="$repo/build/sanitize"
cmake -S "$repo" -B "$build" -DCMAKE_CXX_COMPILER=g++ -DSPARSE_LOWER_SANITIZE=ON -DSPARSE_LOWER_CUDA=OFF >/dev/null
cmake --build "$build" -j "$(nproc)"

tests=()
for name in test_custom_ops test_cuda_bodies test_lower_gpu test_lower_nna test_errors test_hostile test_concurrency \
            test_properties test_site_order; do
  tests+=("$repo/tests/$name.py")
done

# Run from an empty folder: from the repository root, `sparse_lower` would import from the sources.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# onnxruntime's CPU arena and memory patterns carve tensors out of large blocks, where ASan sees no
# bounds: turn them off in every session the tests create, so that every tensor is its own allocation
# (without this, a kernel writing past its output goes unreported). Also mute onnxruntime's logging of
# the errors the tests provoke, which --capture=sys (below) would print.
cat >"$work/sanitize_sessions.py" <<'EOF'
import onnxruntime as ort

ort.set_default_logger_severity(4)

_init = ort.InferenceSession.__init__


def _init_without_arena(self, model, sess_options=None, *args, **kwargs):
    sess_options = sess_options or ort.SessionOptions()
    sess_options.enable_cpu_mem_arena = False
    sess_options.enable_mem_pattern = False
    _init(self, model, sess_options, *args, **kwargs)


ort.InferenceSession.__init__ = _init_without_arena
EOF
cd "$work"
# detect_leaks=0: CPython itself leaks at exit. halt_on_error (and -fno-sanitize-recover): the first report
# ends the process with status 86. --capture=sys: pytest leaves file descriptor 2 alone, so the report
# reaches the terminal instead of a capture file that dies with the process. libubsan is preloaded too:
# it brings in libstdc++, without which ASan's __cxa_throw interceptor fails in a Python process.
SPARSE_LOWER_LIBRARY="$build/libsparse_lower_ops.so" \
SPARSE_LOWER_EMULATED_LIBRARY="$build/libsparse_lower_emulated.so" \
LD_PRELOAD="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libubsan.so)" \
ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:exitcode=86 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:exitcode=86 \
  python -m pytest -q -p no:cacheprovider --capture=sys -p sanitize_sessions "${tests[@]}" "$@"
