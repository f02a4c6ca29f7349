import sys

from clockwork.cluster.cli import main

sys.exit(main())
