"""``python -m wattlab.sync.recorder CONFIG_JSON``: the recorder process a session starts."""

import sys

from wattlab.sync.recorder.process import main

sys.exit(main())
