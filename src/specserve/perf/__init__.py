"""``specserve perf``: decode speed of specserve's weight formats and proposers beside
transformers and llama.cpp on the same prompts, memory bandwidth, quantisation quality, and
the engine's batching benchmark."""
