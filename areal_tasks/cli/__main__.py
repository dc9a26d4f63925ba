"""``python -m areal_tasks.cli``: the same entry point as the ``areal`` console script."""

import sys

from areal_tasks.cli import main

sys.exit(main())
