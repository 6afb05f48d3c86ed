"""The gate: the loop and the parts it is made of.

The loop (`loop.py`: `stream`, `generate`) and the revise pass on a chat API (`revise.py`); the reply
state, session and emitter (`reply.py`); the rewrite check (`rewrite.py`, `rewrite_checks.py`); the typed
result and its receipt (`result.py`, `receipts.py`); the window and trigger policy (`trigger.py`, `probe.py`,
`signals.py`, `surprise.py`); prompts and evidence segments (`prompting.py`); a round's arm calls
(`grounding.py`, `router.py`); the canary and the events. Nothing here knows a backend or an arm by name.
"""
