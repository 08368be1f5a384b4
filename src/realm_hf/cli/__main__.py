"""`python -m realm_hf.cli`: the same as the `realm-hf` command."""

import sys

from .main import main

sys.exit(main())
