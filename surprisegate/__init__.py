"""surprisegate: surprise-gated decoding.

Measure per-token surprise (-log2 p) while a model writes; when a rolling window of it crosses a
calibrated threshold, ground the doubtful span, rewind it with the KV cache kept, inject the evidence
and let the model write the claim again. Every intervention leaves a receipt.
"""

__version__ = "0.1.0"
