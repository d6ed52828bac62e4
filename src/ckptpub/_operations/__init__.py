"""Operations: what ckptpub does with a folder and its manifest (publish, verify, diff, sign).

Each returns data (a ``Manifest``, a ``VerifyReport``, a ``ManifestDiff``, a
``SignatureCheck``) and raises ``CkptpubError`` only for input it cannot use.

Modules (imports go downwards only; from outside this package only ``_hashing``,
``_filesystem``, ``_format`` and ``errors``):

    publishing       ``build_manifest``, ``publish``, ``publish_on_ranks``: hash a folder, write its manifest
    signing          ``model.sig``: sign a published folder, check a signature, ``verify_signed``
    signing_backend  the one module that imports ``model_signing`` (imported only when signing)
    verify           ``verify``: a folder's bytes against its manifest; ``VerifyReport``, ``Problem``
    diff             ``diff_manifests``: two manifests compared; ``ManifestDiff``
    explain          what a difference means: tensor groups, config keys, lineage
"""
