"""The `sparse-lower` command line."""
