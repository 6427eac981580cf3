"""`python -m engine.tiny_model DIR [options]`: see engine/tiny_model/cli.py."""

import sys

from engine.tiny_model.cli import main

sys.exit(main())
