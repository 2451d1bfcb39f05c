"""`python -m server.parallel`: see server/parallel/launcher.py."""

import sys

from server.parallel.launcher import main

if __name__ == "__main__":
    sys.exit(main())
