"""``python -m kairos``: the same commands as the ``kairos`` console script."""

from __future__ import annotations

from kairos.cli import main

raise SystemExit(main())
