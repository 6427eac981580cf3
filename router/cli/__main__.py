"""`python -m router.cli ...` runs `baton ...`."""

import sys

from router.cli.main import main

sys.exit(main())
