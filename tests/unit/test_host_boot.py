"""Boot and driver checks (DOMAIN §1): kernel parameters in the running and configured command
lines, and whether the kernel GRUB boots next has the GPU driver module.

The fixture grub.cfg is Ubuntu's layout: entry 0 'Ubuntu' (5.15.0-194), submenu 1 with
194, 194 recovery, 191, 191 recovery; GRUB_DEFAULT="1>2" pins 5.15.0-191, the only kernel with hydcu.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.recipe.recipe_model import Platform
from host_setup.boot import default_driver, has_module, has_param, plan_boot, read_boot_state
from host_setup.grub import (
    effective_spec,
    grub_cfg_default,
    parse_grub_cfg,
    parse_shell_assignments,
    resolve,
    stable_spec,
)
from host_setup.model import Finding, Severity
from tests.fixtures.host_setup.tree import HYGON, Host, make_host, set_text

GRUB_CFG = (HYGON / "boot/grub/grub.cfg").read_text()
UUID = "4f1c2a9e-6b1d-4c8e-9a51-0d2b7e3c9f10"


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return make_host(tmp_path)


def findings(host: Host, params: tuple[str, ...] = (), module: str | None = "hydcu") -> list[Finding]:
    return plan_boot(read_boot_state(host.root, module), params)


def warnings(items: list[Finding]) -> list[str]:
    return [f.message for f in items if f.severity is Severity.WARN]


def set_grub_default(host: Host, value: str) -> None:
    text = (HYGON / "etc/default/grub").read_text().replace('GRUB_DEFAULT="1>2"', f"GRUB_DEFAULT={value}")
    set_text(host.root, "/etc/default/grub", text)


def set_cfg_default(host: Host, value: str) -> None:
    set_text(
        host.root, "/boot/grub/grub.cfg", GRUB_CFG.replace('set default="1>2"', f'set default="{value}"')
    )


# --- parsing ------------------------------------------------------------------------------------


def test_grub_cfg_menu_tree_skips_function_blocks() -> None:
    menu = parse_grub_cfg(GRUB_CFG)
    assert [e.title for e in menu] == ["Ubuntu", "Advanced options for Ubuntu", "UEFI Firmware Settings"]
    assert menu[0].kernel == "5.15.0-194-generic" and "iommu=pt" in menu[0].args
    assert menu[1].is_submenu and [e.kernel for e in menu[1].children] == [
        "5.15.0-194-generic",
        "5.15.0-194-generic",
        "5.15.0-191-generic",
        "5.15.0-191-generic",
    ]
    assert menu[1].id == f"gnulinux-advanced-{UUID}"
    assert grub_cfg_default(GRUB_CFG) == "1>2"  # not the `${next_entry}` branch


@pytest.mark.parametrize(
    ("spec", "kernel"),
    [
        ("1>2", "5.15.0-191-generic"),
        ("0", "5.15.0-194-generic"),
        ("1", "5.15.0-194-generic"),  # a submenu boots its first entry
        (f"gnulinux-advanced-{UUID}>gnulinux-5.15.0-191-generic-advanced-{UUID}", "5.15.0-191-generic"),
        ("Advanced options for Ubuntu>Ubuntu, with Linux 5.15.0-191-generic", "5.15.0-191-generic"),
    ],
)
def test_grub_default_specs_resolve_to_the_kernel(spec: str, kernel: str) -> None:
    path = resolve(parse_grub_cfg(GRUB_CFG), spec)
    assert path is not None and path[-1].kernel == kernel


def test_unknown_spec_resolves_to_nothing() -> None:
    assert resolve(parse_grub_cfg(GRUB_CFG), "1>9") is None
    assert resolve(parse_grub_cfg(GRUB_CFG), "Windows") is None


def test_saved_default_comes_from_grubenv() -> None:
    assert effective_spec("saved", {"saved_entry": "1>2"}) == "1>2"
    assert effective_spec("${saved_entry}", {}) == "0"
    assert effective_spec(None, {}) == "0"


def test_stable_spec_uses_ids() -> None:
    path = resolve(parse_grub_cfg(GRUB_CFG), "1>2")
    assert path is not None
    assert stable_spec(path) == f"gnulinux-advanced-{UUID}>gnulinux-5.15.0-191-generic-advanced-{UUID}"


def test_default_grub_assignments_quote_and_expand_like_the_shell() -> None:
    values = parse_shell_assignments(
        [
            'GRUB_DEFAULT="1>2"\nGRUB_CMDLINE_LINUX_DEFAULT="quiet splash"  # a comment\n',
            'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT iommu=pt"\n',
            "GRUB_CMDLINE_LINUX='$literal'\n",
        ]
    )
    assert values["GRUB_DEFAULT"] == "1>2"
    assert values["GRUB_CMDLINE_LINUX_DEFAULT"] == "quiet splash iommu=pt"
    assert values["GRUB_CMDLINE_LINUX"] == "$literal"


# --- the GRUB default kernel and its driver -----------------------------------------------------


def test_pinned_default_on_the_kernel_with_hydcu_is_ok_with_advice_to_pin_by_id(host: Host) -> None:
    items = findings(host)
    assert warnings(items) == []
    ok = [f.message for f in items if f.severity is Severity.OK]
    assert ok == [
        "GRUB_DEFAULT in /etc/default/grub (after update-grub): "
        "'1>2' → 'Ubuntu, with Linux 5.15.0-191-generic' boots 5.15.0-191-generic, which has hydcu"
    ]
    pin = next(f for f in items if "pins by menu position" in f.message)
    assert f"gnulinux-5.15.0-191-generic-advanced-{UUID}" in pin.fix
    assert "installed kernels without hydcu: 5.15.0-194-generic" in [f.message for f in items]


def test_a_default_landing_on_the_kernel_without_hydcu_warns_naming_both_kernels(host: Host) -> None:
    set_grub_default(host, "0")
    set_cfg_default(host, "0")
    (warning,) = [f for f in findings(host) if f.severity is Severity.WARN]
    assert "boots 5.15.0-194-generic, which has no hydcu module under /lib/modules/5.15.0-194-generic" in (
        warning.message
    )
    assert "(the running 5.15.0-191-generic has it)" in warning.message
    assert "no GPU" in warning.message and "DOMAIN §1" in warning.why
    assert warning.fix.startswith('pin GRUB_DEFAULT="1>2"') and "5.15.0-191-generic" in warning.fix


def test_saved_entry_pointing_at_the_new_kernel_warns(host: Host) -> None:
    set_grub_default(host, "saved")
    set_cfg_default(host, "${saved_entry}")
    set_text(host.root, "/boot/grub/grubenv", "# GRUB Environment Block\nsaved_entry=1>0\n" + "#" * 900)
    (warning,) = warnings(findings(host))
    assert "'saved' → 'Ubuntu, with Linux 5.15.0-194-generic'" in warning


def test_a_stale_grub_cfg_is_reported_and_both_defaults_are_checked(host: Host) -> None:
    set_grub_default(host, "0")  # edited, but update-grub not run yet: grub.cfg still says 1>2
    items = warnings(findings(host))
    assert any("grub.cfg is stale" in m for m in items)
    assert any("after update-grub" in m and "5.15.0-194-generic" in m for m in items)
    ok = [f.message for f in findings(host) if f.severity is Severity.OK]
    assert any("grub.cfg `set default` (next boot): '1>2'" in m for m in ok)


def test_a_one_shot_next_entry_is_checked_too(host: Host) -> None:
    set_text(host.root, "/boot/grub/grubenv", "next_entry=0\n")
    (warning,) = warnings(findings(host))
    assert warning.startswith("grubenv next_entry (one-shot, next boot): '0'")


def test_a_default_matching_nothing_falls_back_to_entry_0(host: Host) -> None:
    set_grub_default(host, '"1>9"')
    set_cfg_default(host, "1>9")
    (warning,) = warnings(findings(host))
    assert "matches no menu entry, so GRUB falls back to entry 0" in warning
    assert "5.15.0-194-generic" in warning


def test_running_kernel_without_the_module_warns(host: Host) -> None:
    set_text(host.root, "/proc/sys/kernel/osrelease", "5.15.0-194-generic\n")
    assert (
        "the running kernel 5.15.0-194-generic has no hydcu module under /lib/modules/5.15.0-194-generic"
        in (warnings(findings(host)))
    )


def test_no_grub_cfg_is_said_plainly(host: Host) -> None:
    (host.root.boot / "grub" / "grub.cfg").unlink()
    assert "no /boot/grub/grub.cfg: cannot tell which kernel the next boot uses" in warnings(findings(host))


def test_no_module_requirement_means_no_kernel_checks(host: Host) -> None:
    assert findings(host, module=None) == []


def test_modules_are_found_compressed_and_by_either_spelling(host: Host) -> None:
    assert has_module(host.root, "5.15.0-191-generic", "hydcu")
    assert not has_module(host.root, "5.15.0-194-generic", "hydcu")
    assert has_module(host.root, "5.15.0-194-generic", "amdgpu")  # amdgpu.ko.zst
    assert not has_module(host.root, "6.0.0-nonexistent", "hydcu")


def test_the_driver_follows_the_cpu_vendor() -> None:
    assert default_driver(Platform.GFX906, "vendor_id\t: HygonGenuine\n") == "hydcu"
    assert default_driver(Platform.GFX906, "vendor_id\t: AuthenticAMD\n") == "amdgpu"
    assert default_driver(Platform.CPU, None) is None


# --- kernel parameters --------------------------------------------------------------------------


def test_params_on_running_and_configured_lines_are_ok(host: Host) -> None:
    items = findings(host, ("iommu=pt",), module=None)
    assert [(f.severity, f.message) for f in items] == [(Severity.OK, "iommu=pt is on the command line")]


def test_a_param_missing_from_the_configuration_would_be_dropped_by_a_reboot(host: Host) -> None:
    set_text(host.root, "/etc/default/grub", 'GRUB_DEFAULT="1>2"\nGRUB_CMDLINE_LINUX=""\n')
    (warning,) = [f for f in findings(host, ("iommu=pt",), module=None) if f.severity is Severity.WARN]
    assert (
        warning.message == "iommu=pt is active now but missing from /etc/default/grub: a reboot would drop it"
    )
    assert "GRUB_CMDLINE_LINUX_DEFAULT" in warning.fix and "update-grub" in warning.fix


def test_a_missing_param_says_how_to_add_it(host: Host) -> None:
    (warning,) = findings(host, ("pci=disable_acs_redir=",), module=None)
    assert warning.message == "pci=disable_acs_redir=… is not on the running command line"
    assert warning.fix.endswith("reboot")


def test_configured_but_not_yet_booted_says_reboot(host: Host) -> None:
    set_text(host.root, "/proc/cmdline", "BOOT_IMAGE=/boot/vmlinuz-5.15.0-191-generic ro\n")
    (warning,) = findings(host, ("iommu=pt",), module=None)
    assert "(configured: takes effect at the next reboot)" in warning.message
    assert warning.fix == "reboot"


def test_drop_in_files_in_default_grub_d_count(host: Host) -> None:
    set_text(host.root, "/etc/default/grub", 'GRUB_DEFAULT="1>2"\nGRUB_CMDLINE_LINUX=""\n')
    set_text(
        host.root, "/etc/default/grub.d/50-gpu.cfg", 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX iommu=pt"\n'
    )
    items = findings(host, ("iommu=pt",), module=None)
    assert items[0].severity is Severity.OK


@pytest.mark.parametrize(
    ("tokens", "wanted", "found"),
    [
        (("iommu=pt",), "iommu=pt", True),
        (("iommu=on",), "iommu=pt", False),
        (("pci=disable_acs_redir=0000:00:01.1",), "pci=disable_acs_redir=", True),
        (("pci=noaer,disable_acs_redir=0000:00:01.1;0000:01:00.0",), "pci=disable_acs_redir=", True),
        (("pci=noaer",), "pci=disable_acs_redir=", False),
    ],
)
def test_param_matching(tokens: tuple[str, ...], wanted: str, found: bool) -> None:
    assert has_param(tokens, wanted) is found
