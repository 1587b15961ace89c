"""The gateway's hold wing: new requests wait while the controller switches the engine on purpose,
instead of being refused.

Modules by role: ``queue`` (the bounded queue of held requests: ``Hold``, the controller's
``HoldPlan``, how each wait ends, its metrics), ``sse`` (what a held streaming client sees: an event
stream kept alive with comment lines, then the engine's own), ``text`` (the hold in one line for the
status, the CLI and the console).

Nothing is imported here: the CLI and the console import ``hold.text``, which imports nothing, and stay
cheap.
"""
