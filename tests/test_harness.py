"""The test harness (conftest.py): each session lists the tests and files that took the most CPU seconds, its own and
those of the processes a test waited for, which is what CI's length on a machine of few cores follows."""

import os
import subprocess
import sys
import textwrap

from conftest import REPO

PROBE = """
import subprocess, sys, time

def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass

def test_busy():
    burn(0.6)

def test_busy_child():
    subprocess.run([sys.executable, "-c", "import time\\nend = time.process_time() + 0.6\\n"
                    "while time.process_time() < end: pass"], check=True)

def test_sleeping():  # the longest in wall time; some CPU seconds of its own, more than a child's uncounted
    burn(0.2)
    time.sleep(1.5)
"""


def test_the_cpu_summary_ranks_by_cpu_seconds_with_waited_for_children_not_by_wall_time(tmp_path):
    (tmp_path / "test_probe.py").write_text(textwrap.dedent(PROBE))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHEAPTRAIN_TEST_")}  # not make test's queue
    env["PYTHONPATH"] = str(REPO / "tests")  # conftest, as a plugin (-p); the package is installed
    command = [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "test_probe.py"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "most CPU seconds (tests): 3 of 3" in line)
    ranked = [line.split()[-1].split("::")[-1] for line in lines[start + 1 : start + 4]]
    assert set(ranked[:2]) == {"test_busy", "test_busy_child"} and ranked[2] == "test_sleeping", done.stdout
    files = next(i for i, line in enumerate(lines) if "most CPU seconds (test files): 1 of 1" in line)
    assert lines[files + 1].endswith(" test_probe.py") and "in all, this session's tests" in lines[files + 2]
