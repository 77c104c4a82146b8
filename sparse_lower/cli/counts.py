"""Integer options that count something (sites, threads, workers, repeats): checked by argparse when the
command line is read, before any work or side effect, with the option's range in the message."""

from __future__ import annotations

import argparse


def count(least: int):
    """An argparse `type` for an integer >= `least`: `--threads -2` is refused as "'-2' is not an
    integer >= 0" before the command does anything."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not an integer >= {least}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"'{text}' is not an integer >= {least}")
        return value

    parse.__name__ = f"integer >= {least}"  # what argparse names in its own messages
    return parse
