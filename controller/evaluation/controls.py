"""The two ways a compare (or a bench) reaches the engine's controller.

- `http_control`: the CLI, through the admin API (`POST /apply`, `POST /restart`, `GET /status`).
- `driver_control`: the admin API's own `POST /compare`, through the supervisor in-process.

Both answer `describe(status)` with the LaunchInfo a result is tied to (recipe, spec hash, cache
vintage and root, the recipe's declared reproducibility, and the launch's kernel-path proof).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from appliance.engine_secret import redact as redact_keys
from appliance.recipe.recipe_loader import RecipeError
from controller.api_client import ApiError, Client
from controller.evaluation.bench import LaunchInfo
from controller.evaluation.bench_key import read_engine_key
from controller.evaluation.compare import CompareError, Control, launch_info
from controller.evaluation.proof import proof_from_events
from controller.runtime.base import EngineHandle
from controller.store import Store
from controller.supervisor.driver import Driver
from controller.supervisor.preflight import Preflight, UnknownRecipe
from controller.supervisor.signals import Apply, Restart


def http_control(client: Client) -> Control:
    async def call(method: str, path: str) -> Any:
        try:
            if method == "GET":
                return await asyncio.to_thread(client.get, path)
            return await asyncio.to_thread(client.post, path, {})
        except ApiError as exc:
            raise CompareError(f"{method} {path}: {exc}") from exc

    async def apply(recipe: str) -> None:
        try:
            await asyncio.to_thread(client.post, "/apply", {"recipe": recipe})
        except ApiError as exc:
            raise CompareError(f"apply {recipe}: {exc}") from exc

    async def restart() -> None:
        # The warm restart of an arm drains first: its ready time is measured alone on its card(s).
        try:
            await asyncio.to_thread(client.post, "/restart", {"blue_green": False})
        except ApiError as exc:
            raise CompareError(f"POST /restart: {exc}") from exc

    async def status() -> dict[str, Any]:
        result: dict[str, Any] = await call("GET", "/status")
        return result

    async def describe(s: dict[str, Any]) -> LaunchInfo:
        return await describe_http(client, s)

    async def recipe(name: str) -> dict[str, Any] | None:
        try:
            shown = await asyncio.to_thread(client.get, f"/recipes/{name}")
        except ApiError as exc:
            if exc.status == 404:
                raise CompareError(f"no recipe {name!r}") from exc
            raise CompareError(str(exc)) from exc
        doc: dict[str, Any] | None = shown.get("recipe")
        return doc

    async def log(launch_id: str, offset: int) -> tuple[str, int]:
        text, headers = await asyncio.to_thread(client.text, f"/launches/{launch_id}/log?offset={offset}")
        return text, int(headers.get("X-Next-Offset") or headers.get("x-next-offset") or offset)

    async def catalogue() -> dict[str, dict[str, Any]]:
        rows = await call("GET", "/recipes")
        out: dict[str, dict[str, Any]] = {}
        for row in rows:
            doc = await recipe(str(row["name"]))
            if doc is not None:
                out[str(row["name"])] = doc
        return out

    return Control(apply=apply, restart=restart, status=status, describe=describe, recipe=recipe, log=log,
                   catalogue=catalogue)


async def describe_http(client: Client, s: dict[str, Any]) -> LaunchInfo:
    launch = s.get("launch") or {}
    if not launch.get("id"):
        raise CompareError(f"no engine launch (state {s.get('state')})")
    try:
        record = await asyncio.to_thread(client.get, f"/launches/{launch['id']}")
        shown = await asyncio.to_thread(client.get, f"/recipes/{record['recipe']}")
    except ApiError as exc:
        if exc.status == 404:  # a recipe that is gone from the directory: the launch record still counts
            return launch_info(s, record, None, None, proof_from_events(record.get("events") or []))
        raise CompareError(str(exc)) from exc
    rendered = shown.get("rendered") or {}
    info = launch_info(
        s,
        record,
        shown.get("recipe"),
        rendered.get("cache_root"),
        proof_from_events(record.get("events") or []),
    )
    return dataclasses.replace(info, engine_key=await asyncio.to_thread(read_engine_key, launch))


def driver_control(driver: Driver, store: Store, preflight: Preflight) -> Control:
    async def apply(recipe: str) -> None:
        rejected = driver.submit(Apply(recipe))
        if rejected is not None:
            raise CompareError(f"apply {recipe}: {rejected.reason}")

    async def restart() -> None:
        rejected = driver.submit(Restart(blue_green=False))  # measured alone, as http_control's
        if rejected is not None:
            raise CompareError(f"restart: {rejected.reason}")

    async def status() -> dict[str, Any]:
        return driver.status()

    async def describe(s: dict[str, Any]) -> LaunchInfo:
        launch = s.get("launch") or {}
        if not launch.get("id"):
            raise CompareError(f"no engine launch (state {s.get('state')})")
        record = await asyncio.to_thread(store.get_launch, launch["id"])
        if record is None:
            raise CompareError(f"no launch record {launch['id']}")
        spec = await asyncio.to_thread(store.get_spec, launch["id"])
        try:
            recipe: dict[str, Any] | None = (
                await asyncio.to_thread(preflight.recipe, record.recipe)
            ).model_dump(mode="json")
        except (UnknownRecipe, RecipeError):  # a recipe gone from the directory: the record still counts
            recipe = None
        data = record.model_dump(mode="json")
        info = launch_info(
            s, data, recipe, spec.cache_root if spec else None, proof_from_events(data.get("events") or [])
        )
        return dataclasses.replace(info, engine_key=driver.engine_key(launch["id"]))

    async def recipe(name: str) -> dict[str, Any] | None:
        try:
            doc: dict[str, Any] = (await asyncio.to_thread(preflight.recipe, name)).model_dump(mode="json")
        except (UnknownRecipe, RecipeError) as exc:
            raise CompareError(f"recipe {name!r}: {exc}") from exc
        return doc

    async def log(launch_id: str, offset: int) -> tuple[str, int]:
        def read() -> tuple[str, int]:
            record = store.get_launch(launch_id)
            if record is None or record.handle is None:
                return "", offset
            handle = EngineHandle.model_validate(record.handle)
            runtime = driver.runtimes.get(handle.runtime)
            if runtime is None:
                return "", offset
            text, nxt = runtime.read_logs(handle, offset)
            key = driver.engine_key(launch_id)  # error lines are stored with the result: never the key
            return redact_keys(text, [key] if key else []), nxt

        return await asyncio.to_thread(read)

    async def catalogue() -> dict[str, dict[str, Any]]:
        try:
            loaded = await asyncio.to_thread(preflight.catalogue.load)
        except RecipeError as exc:
            raise CompareError(f"the recipe directory: {exc}") from exc
        return {name: r.model_dump(mode="json") for name, r in loaded.items()}

    return Control(apply=apply, restart=restart, status=status, describe=describe, recipe=recipe, log=log,
                   catalogue=catalogue)
