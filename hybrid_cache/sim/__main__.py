"""Entry point: `python -m hybrid_cache.sim` (see `hybrid_cache.sim.cli`)."""

import sys

from hybrid_cache.sim.cli import main

sys.exit(main())
