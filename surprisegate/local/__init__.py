"""What runs locally for the demo and the evaluation: the demo knowledge base (`demo_kb.py`) and a
SearxNG-compatible search server over a corpus of pages (`search_server.py`, `surprisegate websearch-serve`).
"""
