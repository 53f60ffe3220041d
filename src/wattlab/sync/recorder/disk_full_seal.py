"""``python -m wattlab.sync.recorder.disk_full_seal REQUEST``: the step that ends a full-disk run.

Why a module of its own: ``python -m`` must run a module its package has not imported yet,
and the recorder package imports ``disk_full`` for the recorder.
"""

import sys

from wattlab.sync.recorder.disk_full import main

sys.exit(main())
