"""Command groups of ``pdpair-agent``; each module exposes ``register(subparsers)``."""
