"""`python -m server.parallel`: see server/parallel/launcher.py."""

import sys

from server.extra import exit_missing_extra

if __name__ == "__main__":
    try:
        from server.parallel.launcher import main
    except ModuleNotFoundError as exc:
        sys.exit(exit_missing_extra(exc, "python -m server.parallel"))
    sys.exit(main())
