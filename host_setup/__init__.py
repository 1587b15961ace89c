"""The host: read facts through an injected root, and prepare it for a recipe.

Every change is planned first (pure `plan_*` functions over state read from the root: a `Change`
with from → to and the DOMAIN fact behind it, or a `Finding` the operator must act on), then made by
the executor (`executor.apply_plan`), which validates the whole plan, journals each change before
making it, and reverts from the journal alone (`executor.revert_entries`).

Areas: swap (`swap`), sysctls (`sysctl`), memlock (`memlock`), PCIe ACS (`acs`, `pci_config`),
boot parameters and the GRUB default kernel's driver module (`boot`, `grub`), the container
runtime's cgroups (`container_runtime`). `planner` reads the host once and plans every area for a
recipe. Side effects go through `HostRoot` (paths) and `Commands` (mkswap, swapon, setpci,
systemctl, docker), so tests use fixture trees and `FixtureCommands`.
"""
