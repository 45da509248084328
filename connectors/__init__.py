"""Connectors to the outside: the CLI, the local stack, the REST API and workers."""
