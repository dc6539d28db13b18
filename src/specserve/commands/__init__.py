"""One module per ``specserve`` subcommand; each defines ``register(subparsers)``."""
