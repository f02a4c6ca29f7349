"""``python -m clockwork``: the ``clockwork`` command (for an environment whose scripts
are not on the path)."""

import sys

from clockwork.cluster.cli import main

sys.exit(main())
