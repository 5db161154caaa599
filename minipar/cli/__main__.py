"""``python -m minipar.cli VERB ...``: the same as ``minipar VERB ...``."""

import sys

from minipar.cli import main

sys.exit(main())
