"""``python -m wattlab.acquisition.session.source_child SPEC ENDPOINT ...``: one source's process.

Why a module of its own: ``python -m`` must run a module its package has not imported yet,
and the session package imports ``source_process`` for its runner.
"""

import sys

from wattlab.acquisition.session.source_process import main

sys.exit(main())
