"""``python -m ntbridge.cli``: the ``ntbridge`` command."""

import sys

from . import main

sys.exit(main())
