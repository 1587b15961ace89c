"""The controller's HTTP API: the app (app.py) and the gateway-keys routes (keys.py), what the app is
built from (context.py), its request gate (gate.py), and the API's client (client.py)."""
