"""The `appliance` command: `main.py` builds it, each command group registers itself from its own module.

Modules by role:

- ``api_cmd``: `appliance apply | status | logs | stop | restart | launches`: the commands that talk to
  the controller's API (`--api`, $APPLIANCE_API, default http://127.0.0.1:8090); mutations need the admin
  token in $APPLIANCE_ADMIN_TOKEN. `follow_outcome` / `end_of_follow` (a start phase by phase, then its
  outcome) are shared with `up` (controller/cli/lifecycle_cmd.py).
- ``choose_cmd``: `appliance choose` and `appliance choices [ID]`: choosing a recipe for this host with
  evidence (the plan with its ETA, confirmation, progress, the decision record).
- ``doctor_cmd``: `appliance doctor FILE…`: the supervisor's pure diagnosis, run over saved engine logs or
  dmesg text.
- ``engine_cmd``: `appliance engine …`: install and inspect the embedded default engine (vLLM on the CPU).
- ``evaluation_cmd``: `appliance bench | compare | fingerprint | benchmarks`: choosing a recipe on
  evidence (DOMAIN §7).
- ``gateway_cmd``: `appliance gateway`: run the authenticated streaming proxy (standalone or under the
  controller).
- ``gpu_cmd``: `appliance gpu status | reset-done N`: the cards' health as the controller watches it.
- ``host_cmd``: `appliance host …`: the host changes a recipe needs, as plan → apply → revert.
- ``keys_cmd``: `appliance keys create|list|update|revoke`: manage gateway API keys and their limits.
- ``launch_view``: `appliance launches ID`: one launch record as a page to read.
- ``lifecycle_cmd``: `appliance up | serve | down`: the appliance's lifecycle.
- ``main``: The `appliance` command. Each command group lives in its own module and registers itself here.
- ``options``: Options every command group spells the same way.
- ``recipes_cmd``: `appliance recipes …` and `appliance plan`: read, check and render recipes before
  anything runs.
- ``startup_display``: The CLI's start-up display, fed by the controller API's event stream (the JSON
  calls and their client are controller/api_client.py, shared with the evaluation's controls).
- ``token_cmd``: `appliance token rotate`: a new admin token when the old one is lost (or leaked).
- ``usage_cmd``: `appliance usage`: tokens, requests, errors and time per gateway key per hour.
"""
