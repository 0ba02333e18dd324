"""What several test modules share, so that no test module imports from another.

* ``aws``: ``LambdaContext`` and the ``lambda_context`` fixture; ``SqsQueue`` and the ``sqs_queue``
  fixture (moto, a ``runs`` queue); SQS events shaped like ``events/run_sqs.json``.
* ``api``: the API handler driven in-process with HTTP API v2 events; the ``api`` fixture.
* ``executors``: a scripted executor, and a local OpenAI-compatible server (``fake_openai``).
* ``peer``: a scriptable local HTTP(S) server for the executor and transport tests.
* ``db``: waiting for a backend to block on a lock.
* ``postgres``: ``PgServer``, the server the ``pg_server`` fixture yields.
* ``logs``: what the Powertools logger writes.
* ``sam``: the SAM template translated by samtranslator, its conditions settled for given parameters.

Fixtures are registered in ``tests/conftest.py`` (``api`` in ``tests/db`` and ``tests/e2e``).
``tests/unit/test_layout.py`` holds every test module to importing only from here and ``tests.factories``,
never from another test module or a conftest.
"""
