"""Sampling rules shared by every decoding loop: logit processing, sampling, stop conditions.

A leaf of the engine's layers: it depends only on :mod:`specserve.sampling_params`, so plain
decoding, draft models, the verifier and the engine all use the same rules.
"""
