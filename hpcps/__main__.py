"""``python -m hpcps`` — the same as the ``hpcps`` command."""

import sys

from hpcps.cli.main import main

sys.exit(main())
