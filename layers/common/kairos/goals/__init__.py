"""Goals and bounded agent loops (docs/api.md "Goal loops").

A loop is a schedule row marked ``loop``: ``POST /v1/loops`` is the only way to make one
(``kairos.goals.loops``), with fixed policies the schedule routes cannot loosen (``policy``). Its goal
is an envelope stored with the definition, so ``schedule_revisions`` keeps every goal; the API shows
only its safe projection. Each loop run must end by calling the ``goal_report`` tool with one closed
disposition (``report``); a ``needs_input`` report parks the run on an owner's answer
(``kairos.input_requests``).

Modules: ``policy`` (pure: the loop body, the fixed policies, the caps, the goal envelope), ``loops``
(create, read, edit under a new revision), ``report`` (the tool and the effects of each disposition,
inside the run worker's fenced transactions). Importing this package loads nothing else.
"""
