"""``python -m planner.cli``: the same as the ``plan`` command."""

import sys

from planner.cli.main import main

sys.exit(main())
