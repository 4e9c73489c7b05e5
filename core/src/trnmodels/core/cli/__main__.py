"""``python -m trnmodels.core.cli``: the ``trnmodels`` console script without installing it."""

import sys

from . import main

sys.exit(main())
