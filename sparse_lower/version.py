"""The installed distribution's version, read once: `sparse_lower.__version__`, `sparse-lower --version`
and the version stamped into every lowered model."""

from importlib import metadata

try:
    VERSION = metadata.version("sparse-lower")
except metadata.PackageNotFoundError:  # the source tree, never installed
    VERSION = "unknown (not installed)"
