"""``python -m minipar.run STRATEGY ...``: the same as ``minipar run STRATEGY ...``.

Through :func:`minipar.cli.main`, so a bad option (one line, exit 2), ``--help``,
Ctrl-C and SIGTERM end it exactly as they end ``minipar run``."""

import sys

from minipar.cli import main

sys.exit(main(["run", *sys.argv[1:]]))
