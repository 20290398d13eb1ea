"""`python -m tvmsched` is the `tvmsched` command."""

import sys

from tvmsched.cli import main

sys.exit(main())
