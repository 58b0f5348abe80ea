"""``python -m collab_env.cli``: the ``collab-env`` command."""

import sys

from collab_env.cli.app import main

sys.exit(main())
