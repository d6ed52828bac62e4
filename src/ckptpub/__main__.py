"""``python -m ckptpub``: the same CLI as the ``ckptpub`` command."""

import sys

from .cli import main

sys.exit(main())
