"""Argument parsing of the side commands (``python -m <package>.demo``, ``.plot``, ``.doctor``, ...)."""

from __future__ import annotations

import argparse
from typing import NoReturn


class CommandParser(argparse.ArgumentParser):
    """argparse, with a usage mistake reported in one line (exit status 2), like the project's errors."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}; see {self.prog} --help\n")


def command_parser(command: str, description: str) -> CommandParser:
    """A parser named as the user types the command; ``--help`` prints ``description`` verbatim."""
    return CommandParser(
        prog=f"python -m {__package__}.{command}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
