"""The appliance's packages import one way at run time (the "Layers inside appliance" contract in
pyproject.toml): no import cycle, and a runtime plug-in names the recipe and the launch spec for its
type hints only.

import-linter reads TYPE_CHECKING imports as imports, and a plug-in must name `Recipe` and `LaunchSpec`
in its signatures while those models build their `runtime:` unions from the plug-ins' registry; so the
contract ignores exactly those two type-only imports, and these tests hold that they stay type-only
(a plug-in that imported either at run time, even inside a function, would close the circle again).
"""

from __future__ import annotations

import grimp

# What the contract's ignore_imports lets appliance.runtimes import from appliance.recipe: for type
# hints, under TYPE_CHECKING.
TYPE_ONLY = {"appliance.recipe.recipe_model", "appliance.recipe.launch_spec"}


def _graph(*, type_checking: bool) -> grimp.ImportGraph:
    # cache_dir=None: grimp's cache would be written into the working tree.
    return grimp.build_graph("appliance", exclude_type_checking_imports=not type_checking, cache_dir=None)


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _runtimes_to_recipe(graph: grimp.ImportGraph) -> set[tuple[str, str]]:
    return {(importer, imported)
            for importer in graph.find_descendants("appliance.runtimes")
            for imported in graph.find_modules_directly_imported_by(importer)
            if imported.startswith("appliance.recipe.")}


def test_the_appliance_has_no_import_cycle_at_run_time() -> None:
    assert _cycles(_graph(type_checking=False)) == []


def test_a_runtime_plug_in_imports_nothing_of_the_recipe_package_at_run_time() -> None:
    assert _runtimes_to_recipe(_graph(type_checking=False)) == set()


def test_the_plug_ins_type_only_imports_are_the_ones_the_contract_ignores() -> None:
    """With type hints counted, a plug-in reaches only the two models whose unions it feeds."""
    imported = {b for _, b in _runtimes_to_recipe(_graph(type_checking=True))}
    assert imported == TYPE_ONLY


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The finder above, on the graph with type hints counted: the plug-ins and the two models do form
    a circle there (which is why the contract names those imports)."""
    cycles = _cycles(_graph(type_checking=True))
    assert any({"appliance.recipe.recipe_model", "appliance.runtimes.registry"} <= set(c) for c in cycles)
