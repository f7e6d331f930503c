"""``python -m fairfl.cli``: the same as ``python -m fairfl``."""
import sys

from . import main

sys.exit(main())
