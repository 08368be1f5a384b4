"""`python -m realm_hf.cli`: the same as the `realm-hf` command."""

import sys

from realm_hf_cli import main

sys.exit(main())
