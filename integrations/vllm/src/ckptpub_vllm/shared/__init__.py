"""What every process of the plugin uses: the engine's, the daemon's and ``ckptpub preload``'s.

The lowest layer: its modules import ``ckptpub``'s public modules and each other, never
a layer above, and none imports vLLM or torch at import time (``ckptpub preload`` imports
:mod:`.daemon_reports`; vLLM is imported inside the functions that patch it).

* :mod:`.log`: the plugin's logger (one line per record).
* :mod:`.options`: ``--load-format manifest_cache`` (``LOAD_FORMAT``) and its options.
* :mod:`.refusals`: refusals logged once, and relayed to the process that started the engine.
* :mod:`.own_files`: the one opening rule for the plugin's own files (the relay file, the
  supervisor's lock and daemon logs): no symlink followed, no FIFO waited on.
* :mod:`.key`: vLLM's ``hash_checkpoint`` patched to the manifest's identity (workers, daemons).
* :mod:`.startup`: the checks at every engine start, before any weight arrives.
* :mod:`.daemon_reports`: the daemons' report lines and ckptpub's requests to a daemon.
* :mod:`.object_store`: an ``s3://`` model's prefix, and vLLM's pulled copy of its small files.
"""
