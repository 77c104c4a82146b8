#!/usr/bin/env bash
# Builds and installs TorchSparse from a checkout (`bash tools/bench/install_torchsparse.sh CHECKOUT`) into the
# current Python environment, CPU-only: without CUDA its setup.py compiles the CPU kernels as a CppExtension
# (about 2 minutes on 2 cores). TorchSparse is not on PyPI; mmdetection3d installs v1.4.0, which
# tests/test_torchsparse_export.py and tools/torchsparse_networks.py use. Needs torch (the `spconv` extra's
# torch==2.13.0) already installed, and root for Debian's libsparsehash-dev (Google's dense_hash_map, which
# its CPU kernels include).
set -euo pipefail

checkout=${1:?give a TorchSparse checkout (git clone … && git checkout v1.4.0)}
if ! dpkg -s libsparsehash-dev >/dev/null 2>&1; then
  apt-get install -y libsparsehash-dev
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$checkout"/. "$work"  # its build writes into the tree
MAX_JOBS=${MAX_JOBS:-2} python -m pip install --no-build-isolation --no-deps "$work"
python -c "import torchsparse; print('TorchSparse', torchsparse.__version__)"
