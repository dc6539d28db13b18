"""``specserve experiment``: the reference A/B study (baseline vs speculative) end to end."""
