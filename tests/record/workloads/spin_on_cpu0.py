"""Spins in user space on CPU 0 for SECONDS seconds once told (a line on stdin), touching
no socket: whatever interrupt comes in on CPU 0 meanwhile finds it the current task.
Prints ``waiting`` first.  Usage: spin_on_cpu0.py SECONDS"""

import os
import sys
import time


def main() -> None:
    seconds = float(sys.argv[1])
    os.sched_setaffinity(0, {0})
    print("waiting", flush=True)
    sys.stdin.readline()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


if __name__ == "__main__":
    main()
