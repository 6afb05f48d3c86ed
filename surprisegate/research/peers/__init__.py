"""The field's mid-generation retrieval methods as `eval` modes, on the gate's prompt, arms and grading.

One module per method holds its trigger and query, pinned to the method's own code (tests/test_peers.py):
dragin.py (RIND + QFS), etc.py (entropy trend), seakr.py (EigenScore); run.py holds their loops and
modes.py names the modes `eval` runs. FLARE is `evaluate.run_flare`. Each needs what only an in-process
transformers model gives (attention, hidden states, samples), so these modes run with `--backend transformers`.
"""
