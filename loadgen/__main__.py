"""`python -m loadgen` is `baton bench`."""

from loadgen.cli import main

raise SystemExit(main())
