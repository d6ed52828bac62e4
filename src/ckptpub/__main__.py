"""``python -m ckptpub``: the same CLI as the ``ckptpub`` command."""

from .cli import run

run()
