"""Executors: what calls a model endpoint (or stands in for one) for a run's agent.

* ``registry``: an agent's ``executor`` name to the object that runs its calls (``get``, ``NAMES``).
* ``catalog``: the one table of executor names and what each can do (tools, model calls, needs).
* ``base``: the contract every executor keeps; ``egress``: the outbound HTTP every network executor uses.
* ``echo``, ``openai``, ``http``, ``bedrock``: the executors.

Guarantees: this package's ``__init__`` imports nothing, so a module that imports one executor module
(``from kairos.executors import egress``) never loads the registry, and the registry's lazy imports of
the executors never form an import cycle with it (``tests/unit/test_imports.py``).
"""
