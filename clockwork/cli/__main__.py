import sys

from clockwork.cli import main

sys.exit(main())
