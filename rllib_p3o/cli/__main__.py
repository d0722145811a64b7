"""``python -m rllib_p3o.cli``: the ``rllib-p3o`` command."""

import sys

from rllib_p3o.cli import main

sys.exit(main())
