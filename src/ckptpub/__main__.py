"""``python -m ckptpub``: the same CLI as the ``ckptpub`` command, with the same entry point."""

from .console import main

main()
