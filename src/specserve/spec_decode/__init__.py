"""Speculative decoding: proposers behind one contract, the batched verifier, the k
controller, acceptance statistics, and the batch-1 loops (plain, speculative, fused).

Start with ``speculative_loop.py``: the whole algorithm (propose → verify → accept → roll
back) in one loop over ``proposer.py`` and ``rejection_sampler.py``.
"""
