"""`python -m rlhfless ...`: the same command line as the `rlhfless` script."""

import sys

from rlhfless.cli import main

sys.exit(main())
