"""``python -m hcp_tune``: the command-line entry."""
import sys

from hcp_tune.cli import main

sys.exit(main())
