"""Execution: what the run function does with a run id — claim, execute, end — above the run record.

Modules: ``sqs`` (the SQS batch adapter the run function calls), ``claim`` (the claim and what an
attempt starts from, ``Claimed``, or why it does not, ``Outcome``), ``heartbeat`` (the lease thread
that reads the cancel flag and aborts a call in flight), ``execute`` (``process``: claim, execute, end),
``tool_loop`` (the tool loop) with ``steps`` (its step log) and ``stops`` (how an attempt stops early),
``goal_report`` (the ``goal_report`` tool: how a loop run ends) and ``corpus`` (the corpus phases).

Guarantees: every write of a run's state goes through ``kairos.runs`` under the attempt's fence.
Must not: be imported by the API's routes (they read runs through ``kairos.runs``).
"""
