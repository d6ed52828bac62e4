"""The filesystem layer: the files of a checkpoint folder or a run folder, read and written safely.

Every rule that keeps ckptpub inside a folder lives here: no symlink followed out of
it, no FIFO blocked on, every size bounded before a byte is read, every write atomic.

Modules (imports go downwards only; from outside this package only ``_format`` and ``errors``):

    run_index     ``ckptpub-index.jsonl``: a run's published steps, appended a line at a time
    model_files   which safetensors files are the weights, the config's meaning; reads shard headers
    read          ``read_manifest``: one open, one fstat, one read (an ``s3://`` prefix: one GET)
    jsonfiles     documents replaced atomically, logs appended a whole line at a time
    scan          which files of a folder (or objects of an ``s3://`` prefix) count; the symlink and
                  file-name rules; path arguments
    sources       a file or object opened for reading through one interface (``open_source``)
    objects       ``s3://`` prefixes: listing, bounded and ranged GETs, conditional puts (boto3)
    hub_cache     models in the Hugging Face cache: a hub id's snapshot, resolved offline, every ref and
                  snapshot name read from the cache checked before it becomes a path
    safe_open     ``open_regular`` (no-follow, non-blocking, the file the scan saw), ``read_bounded``,
                  the symlink rule (``resolve_inside``, ``open_inside``, ``read_inside``)
    hub_layout    the Hugging Face cache's layout; which symlinks of a snapshot are its files
                  (``is_cached_blob``)
"""
