"""Corpus runs as the worker executes them: one run's child state, phase by phase.

Modules: ``manifest`` (enumerate: inline items, S3), ``mapping`` (partitions, repair generations,
leases), ``answers`` (strict JSON Lines), ``reduce``, ``export`` (checkpointed multipart S3),
``context`` (what a phase sees of its run), ``phases`` (the adapter the worker calls).
The ``corpus`` field's validation is ``kairos.schedules.corpus_spec``; pause and resume and the
progress the API shows are ``kairos.runs.corpus_control`` and ``kairos.runs.corpus_progress``.
"""
