"""Names the appliance puts on every engine, defined once.

A leaf module (it imports nothing) so that the runtime plug-ins in appliance/runtimes/, which may
not import appliance/recipe/launch_spec.py at import time, and the controller's effectful halves can all
take the same strings from here.
"""

from __future__ import annotations

# Labels every engine launched by the appliance carries (docker labels, kubernetes labels; the
# PID file holds the same).
LABEL_MANAGED = "appliance.managed"
LABEL_LAUNCH_ID = "appliance.launch_id"
LABEL_RECIPE = "appliance.recipe"
LABEL_SPEC_HASH = "appliance.spec_hash"
# Which appliance instance launched it: two appliances (two APPLIANCE_HOMEs) may share a
# Docker daemon or a cluster namespace, and each adopts only its own engines.
LABEL_INSTANCE = "appliance.instance"

# The environment variable vLLM reads its API key from. The controller never puts the key there
# (a key file instead: there it moved vLLM 0.26.0's compile cache);
# it is named to keep it out of specs and to read old launches back.
ENGINE_KEY_ENV = "VLLM_API_KEY"
