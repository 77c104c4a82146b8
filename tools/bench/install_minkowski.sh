#!/usr/bin/env bash
# Builds and installs MinkowskiEngine 0.5.4 (CPU, OpenBLAS) into the current Python environment, as the
# benchmark's MinkowskiEngine peer needs it. About 7 minutes on 2 cores. Needs torch (the `spconv`
# extra's torch==2.13.0) already installed, and root for Debian's libopenblas-dev.
#
# Two things the PyPI sdist needs on today's tools, applied to a throw-away copy:
# * `pip download` evaluates its setup.py, whose numpy.distutils path fails with new setuptools:
#   SETUPTOOLS_USE_DISTUTILS=stdlib avoids it (the build passes --blas, which skips that path);
# * its Python files import `Sequence` from `collections`, gone since Python 3.10.
# Its setup.py also runs `pip uninstall MinkowskiEngine` and `rm -rf build` by itself.
set -euo pipefail

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! dpkg -s libopenblas-dev >/dev/null 2>&1; then
  apt-get install -y libopenblas-dev
fi
cd "$work"
SETUPTOOLS_USE_DISTUTILS=stdlib python -m pip download MinkowskiEngine==0.5.4 --no-deps --no-binary :all: \
  --no-build-isolation -d .
tar xzf MinkowskiEngine-0.5.4.tar.gz
cd MinkowskiEngine-0.5.4
sed -i 's/^from collections import Sequence, namedtuple$/from collections import namedtuple\nfrom collections.abc import Sequence/; s/^from collections import Sequence$/from collections.abc import Sequence/' \
  MinkowskiEngine/*.py MinkowskiEngine/utils/*.py
MAX_JOBS=${MAX_JOBS:-2} python setup.py bdist_wheel --cpu_only --blas=openblas -d "$work/dist"
python -m pip install --no-deps "$work"/dist/minkowskiengine-0.5.4-*.whl
python -c "import MinkowskiEngine as ME; print('MinkowskiEngine', ME.__version__)"
