"""``python -m yfpp``: the ``yfpp`` command."""

import sys

from yfpp.cli import main

sys.exit(main())
