"""KV cache bookkeeping: the block pool, per-request block tables with rollback, sizing,
and the contiguous single-sequence cache of the batch-1 loops. Memory, not policy."""
