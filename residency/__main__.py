"""`python -m residency`: the command line (`residency.cli.main`)."""

import sys

from residency.cli.main import console_main

if __name__ == "__main__":
    sys.exit(console_main())
