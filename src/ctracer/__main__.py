"""``python -m ctracer``: same as the ``ctracer`` command."""

import sys

from ctracer.cli import main

sys.exit(main())
