"""Training draft heads (EAGLE-3, Medusa) for a target: ``specserve train-draft``."""
