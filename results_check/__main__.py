"""``python -m results_check [PAGE ...]``: the results check (`results_check.cli`)."""

import sys

from results_check.cli import main

sys.exit(main())
