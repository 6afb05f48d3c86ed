"""`surprisegate serve`: an OpenAI-compatible server with the gate in the loop (DESIGN.md §9).

  wire.py     requests: every field checked at the edge, a per-request Config (400s name the field)
  gate.py     admission (slots + a bounded queue, 429), one thread per reply, receipts with rotation
  replies.py  bodies, stream chunks, logprobs from the loop's surprises, stop strings
  app.py      the Starlette routes, auth, body limits, OpenAI-shaped errors
  metrics.py  Prometheus text through the official client
  http.py     uvicorn: a header deadline for slow clients; a server thread for tests and the bench
  main.py     the `serve` command: runtime (runtime.assemble), slots per backend, settings, uvicorn

Needs the `serve` extra: pip install 'surprisegate[serve]'. Import from the modules (`serve.app.create_app`);
this file imports none of them, so no module here depends on the package (tests/test_imports.py).
"""
