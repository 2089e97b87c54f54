"""How the entry points run their main(): a problem with the input is one line (`run_main`), and a reader that stops
reading early (`... | head`) ends the output quietly, as it ends a Unix tool's.

Apart from the package root, so that the training code (whose files version each ledger entry) does not import it.
"""

import os
import select
import sys
from collections.abc import Callable

from cheaptrain import run_main

# the status a shell gives a tool that SIGPIPE ended (128 + 13): `set -o pipefail` sees the cut as `ls | head` shows it
CUT_SHORT = 141


def run_command(main: Callable[[], None]) -> None:
    """`run_main(main)`; output cut short by its reader exits with CUT_SHORT, without a traceback. A broken pipe that
    is not standard output's (a child process's, a socket's) stays an error with its traceback."""
    try:
        run_main(main)
    except SystemExit:
        flush_output()  # argparse's --help, run_main's status 2: the status stays theirs
        raise
    except BrokenPipeError:
        if not stdout_reader_gone():
            raise
        silence_output()
        sys.exit(CUT_SHORT)
    if not flush_output():
        sys.exit(CUT_SHORT)


def flush_output() -> bool:
    """Flush standard output here, not in the interpreter's flush at exit where a closed pipe is a traceback: whether
    the reader took it all."""
    try:
        sys.stdout.flush()
        return True
    except BrokenPipeError:
        silence_output()
        return False


def silence_output() -> None:
    """/dev/null in standard output's place, so that what is left unwritten and the flush at exit go nowhere."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def stdout_reader_gone() -> bool:
    """Whether standard output is a pipe or socket whose reading end has closed (poll reports an error or a hang-up
    there; a file, a terminal or an open pipe reports neither)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by an object without a descriptor (io.StringIO), closed
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
