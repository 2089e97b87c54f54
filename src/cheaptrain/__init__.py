"""Cheaper CIFAR training: Data Fine-Pruning and Weight Update Skipping, reproduced."""

from collections.abc import Callable


class UserError(Exception):
    """A problem with the user's input or environment: stages print its message, not a traceback."""


def run_main(main: Callable[[], None]) -> None:
    """Run a stage's main(): a UserError exits with its message and status 2 instead of a traceback."""
    import sys

    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
