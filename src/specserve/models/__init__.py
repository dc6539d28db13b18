"""What the network computes: the architecture description, the decoder, the KV cache
tensors it reads and writes, quantised layers (``quant/``) and native kernels (``native/``)."""
