"""``python -m minipar.run STRATEGY ...``: the same as ``minipar run STRATEGY ...``."""

import sys

from minipar.run import main

sys.exit(main(sys.argv[1:]))
