"""The controller's HTTP API: the app (app.py) and the routers service hands it (keys.py, gpu.py,
usage.py). What the app is built from is controller/api_context.py, what it checks before any route
runs controller/api_guard.py, and its client controller/api_client.py: each at its own layer."""
