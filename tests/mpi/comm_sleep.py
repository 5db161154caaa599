"""Write this rank's pid (and its parent's) to DIR, then sleep: for the launcher timeout test."""

import os
import sys
import time

with open(os.path.join(sys.argv[1], f"pid.{os.getpid()}"), "w") as f:
    f.write(f"{os.getpid()} {os.getppid()}\n")
time.sleep(120)
