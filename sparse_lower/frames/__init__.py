"""Running a lowered model over many frames, locally or on Ray: `run_frames` and `sparse-lower run`."""

from .files import find_frames
from .run import RunSummary, is_lowered, run_frames, runnable

__all__ = ["RunSummary", "find_frames", "is_lowered", "run_frames", "runnable"]
