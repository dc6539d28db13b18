"""``specserve perf``: decode speed of specserve's weight formats and proposers beside
transformers, llama.cpp and vLLM on the same prompts, memory bandwidth and quantisation
quality.

- ``options.py``: the command's flags; ``main.py``: its run (``commands/perf.py`` registers it);
- ``arms.py``: one function per in-process engine and mode; ``worker_arms.py``: the arms run by
  another interpreter, ``llamacpp_worker.py`` and ``vllm_worker.py`` (child processes);
  ``report.py``: tables and quality measures; ``profile.py``: ``--profile``;
- ``engine_batching.py``: the engine's batching benchmark, a module of its own
  (``python -m specserve.perf.engine_batching``).
"""
