"""``python -m pykvpool.cli``: the ``pykvpool`` command."""

import sys

from pykvpool.cli.main import main

sys.exit(main())
