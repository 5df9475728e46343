"""The loopwarden application: config, pipeline, middlewares, agents, state, HTTP, CLI."""

__version__ = "0.1.0"
