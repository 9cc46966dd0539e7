"""Argument parsing of the side commands (``python -m <package>.demo``, ``.plot``, ``.doctor``, ...)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn

from .constants import PACKAGE


class CommandParser(argparse.ArgumentParser):
    """argparse, with a usage mistake reported in one line (exit status 2), like the project's errors."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}; see {self.prog} --help\n")


def command_parser(command: str, description: str) -> CommandParser:
    """A parser named as the user types the command; ``--help`` prints ``description`` verbatim."""
    return CommandParser(
        prog=f"python -m {PACKAGE}.{command}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def whole_number(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}")
        return value

    return parse
