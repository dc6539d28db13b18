"""specserve: speculative decoding engine, server, benchmark harness and tuner."""

__version__ = "0.1.0"
