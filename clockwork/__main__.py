"""``python -m clockwork``: the ``clockwork`` command (for an environment whose scripts
are not on the path). ``python -m`` puts the current folder first on the path: a
``worker.py`` or ``controller.py`` there would be imported in place of this
installation's packages, so the folder is taken off unless it is the one that holds
them (a checkout run from its root)."""

import os
import sys

_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path
               if os.path.abspath(p or os.curdir) != os.path.abspath(os.curdir)
               or os.path.abspath(os.curdir) == _root]

from clockwork.cluster.cli import main  # noqa: E402

sys.exit(main())
