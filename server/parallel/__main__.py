"""`python -m server.parallel`: see server/parallel/launcher.py."""

import sys

from server.parallel.launcher import main

sys.exit(main())
