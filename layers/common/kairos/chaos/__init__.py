"""``kairos chaos``: a seeded, replayable rehearsal of the faults the cloud throws, over the local stack.

Modules: ``plan`` (the workload and the faults from one ``random.Random(seed)``), ``driver`` (the local
stack driven on a simulated database clock, the faults armed), ``invariants`` (what must hold
afterwards), ``rehearse`` (one rehearsal and its table), ``command`` (the CLI's arguments). Not part of
the Lambda layer's runtime path: nothing here is imported by a handler.
"""
