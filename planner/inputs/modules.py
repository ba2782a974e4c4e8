"""Where a ``package.module:factory`` model spec's module is found: on the import path, installed,
or in the working folder."""

from __future__ import annotations

import os
import sys


def import_from_working_folder() -> None:
    """Let ``package.module:factory`` specs import modules of the working folder (the ``plan``
    script's import path holds its own folder, not this one); put last, after the installed
    packages and the planner's own, so that no module of theirs is shadowed."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)
