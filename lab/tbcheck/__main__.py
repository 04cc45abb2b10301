"""``python -m lab.tbcheck``: :mod:`.main`."""

import sys

from .main import main

sys.exit(main())
