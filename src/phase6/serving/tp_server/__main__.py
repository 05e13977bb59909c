"""``python -m phase6.serving.tp_server`` (TP > 1: under torchrun, one process per rank)."""

import sys

from phase6.serving.tp_server.server import main

sys.exit(main())
