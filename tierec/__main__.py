"""``python -m tierec`` (and ``torchrun -m tierec``) runs the command line."""

import sys

from tierec.cli import main

sys.exit(main())
