"""``python -m hpcps`` — the same as the ``hpcps`` command."""

import sys

from .cli import main

sys.exit(main())
