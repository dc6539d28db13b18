"""``specserve perf``: decode speed of specserve's weight formats and proposers beside
transformers and llama.cpp on the same prompts, memory bandwidth and quantisation quality.

- ``options.py``: the command's flags; ``main.py``: its run (``commands/perf.py`` registers it);
- ``arms.py``: one function per engine and mode; ``report.py``: tables and quality measures;
  ``profile.py``: ``--profile``; ``llamacpp_worker.py``: the llama.cpp child process;
- ``engine_batching.py``: the engine's batching benchmark, a module of its own
  (``python -m specserve.perf.engine_batching``).
"""
