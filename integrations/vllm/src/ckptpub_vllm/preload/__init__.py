"""``ckptpub preload``: keep vLLM's weight-cache daemon holding exactly the checkpoint you serve.

vLLM's weight-cache daemon computes its key once and has no reload command, so
something has to decide when the daemon must be replaced. This subpackage is that
something: a supervisor process that watches a target (a checkpoint folder, or the
newest published step of a training run), and re-preloads exactly when the target's
manifest identity changes.

Modules (imports go downwards only; none of them imports vLLM):

* :mod:`.decide`: pure functions: what to do about the target (:func:`decide`).
* :mod:`.observe`: what the target is now (:func:`observe_folder`, :func:`observe_run`):
  the manifests, the run index and ``ckptpub verify`` results ``decide`` is given.
* :mod:`.daemon_process`: start, confirm, stop and adopt one daemon command.
* :mod:`.status`: the state directory (status file, decision log, daemon records).
* :mod:`.schema`: the shapes of what the supervisor writes there, checked on reading.
* :mod:`.supervisor`: the loop that ties them together (a state machine over ``State``).
* :mod:`.cli`: ``ckptpub preload`` (an entry point of ``ckptpub.commands``).
"""
