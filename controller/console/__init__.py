"""The operator console: server-rendered pages on the controller (routes/, one module per area)."""
