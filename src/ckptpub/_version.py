"""The version of ckptpub: in every manifest it writes (``provenance.producer``) and in ``--version``.

A module of its own, at the bottom of the layers, so that publishing can record it
without importing the package's ``__init__`` (which imports every layer).
"""

__version__ = "0.1.0"
