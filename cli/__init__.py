"""The `likes` command: one entry point, one command group per concern."""
