"""``python -m zero_lab.report <run or sweep dir> [--out DIR]``."""

import sys

from zero_lab.report.cli import main

sys.exit(main())
