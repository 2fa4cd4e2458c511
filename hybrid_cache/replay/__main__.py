"""Entry point: `python -m hybrid_cache.replay` (see `hybrid_cache.replay.replay`)."""

import sys

from hybrid_cache.replay.replay import main

sys.exit(main())
