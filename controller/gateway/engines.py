"""The gateway's engines: named slots, each with its upstream ``Slot``, its ``Hold`` and the model
names it claims, and the one map from a model name to the engine serving it.

Several engines may run on one host behind one gateway; a request goes to the engine whose claimed
names (its served model and the recipe's aliases) hold the body's ``model``: one dict lookup on the
name the proxy already read (``jsonbody.read_model``). A name belongs to at most one engine
(``claim`` refuses a name another engine holds). An engine keeps its names while it has no upstream
(stopped, restarting, dead), so that its clients get its hold or its 503 with its reason rather than
a 404, and other engines keep answering. Today's controller names no engine: everything it says is
about the ``default`` one, and with one engine every request goes to it as before (no model needed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from controller.gateway.hold.queue import Hold
from controller.gateway.slot import Slot
from controller.gateway.upstream_client import UpstreamPool

DEFAULT = "default"
# The metric label of a request no engine took (unknown model, refused before routing): the label's
# values are the configured engines' served names and this, never a string a client chose.
UNKNOWN_MODEL = "unknown"


@dataclass
class Engine:
    name: str
    slot: Slot
    hold: Hold
    # The names this engine claims (kept while it has no upstream); None: it claims none (a gateway
    # started without a served name, or a slot whose model is not known yet).
    served_model: str | None = None
    aliases: frozenset[str] = field(default_factory=frozenset)
    # Its own connections and connection bound (``proxy.Proxy.pool_for``: made on first use), so that
    # one engine's load never takes the connections another's requests need.
    pool: UpstreamPool | None = None

    @property
    def names(self) -> frozenset[str]:
        if self.served_model is None:
            return frozenset()
        return self.aliases | {self.served_model}

    @property
    def label(self) -> str:
        """This engine's ``model`` metric label: its served name (the engine's name if it has none)."""
        return self.served_model if self.served_model is not None else self.name


class Engines:
    def __init__(self, make_slot: Callable[[], Slot], make_hold: Callable[[], Hold]) -> None:
        self._make_slot = make_slot
        self._make_hold = make_hold
        self._engines: dict[str, Engine] = {}
        self._by_model: dict[str, Engine] = {}
        # Told of every engine created (the app wires its hold's release and metrics there).
        self.on_create: Callable[[Engine], None] | None = None

    def __iter__(self) -> Iterator[Engine]:
        return iter(list(self._engines.values()))

    def __len__(self) -> int:
        return len(self._engines)

    def get(self, name: str) -> Engine | None:
        return self._engines.get(name)

    def ensure(self, name: str) -> Engine:
        """The engine ``name``, created (no upstream, no names) if it is new."""
        engine = self._engines.get(name)
        if engine is None:
            engine = self._engines[name] = Engine(name, self._make_slot(), self._make_hold())
            if self.on_create is not None:
                self.on_create(engine)
        return engine

    @property
    def only(self) -> Engine | None:
        """The one engine when exactly one exists: then every request goes to it, as before."""
        if len(self._engines) == 1:
            return next(iter(self._engines.values()))
        return None

    def serving(self, model: str) -> Engine | None:
        """The engine that claims ``model`` (a served name or an alias)."""
        return self._by_model.get(model)

    def conflict(
        self, name: str, served_model: str | None, aliases: frozenset[str]
    ) -> tuple[str, str] | None:
        """(a name, the other engine claiming it) if engine ``name`` may not claim these names."""
        wanted = aliases | {served_model} if served_model is not None else frozenset[str]()
        for model in sorted(wanted):
            other = self._by_model.get(model)
            if other is not None and other.name != name:
                return model, other.name
        return None

    def claim(self, engine: Engine, served_model: str | None, aliases: frozenset[str]) -> None:
        """``engine`` now claims these names (and no longer its old ones). Check ``conflict`` first."""
        for model in engine.names:
            if self._by_model.get(model) is engine:
                del self._by_model[model]
        engine.served_model = served_model
        engine.aliases = aliases if served_model is not None else frozenset()
        for model in engine.names:
            self._by_model[model] = engine

    def remove(self, name: str) -> Engine | None:
        engine = self._engines.pop(name, None)
        if engine is not None:
            for model in engine.names:
                if self._by_model.get(model) is engine:
                    del self._by_model[model]
        return engine

    def labels(self) -> frozenset[str]:
        """Every ``model`` label value in use now."""
        return frozenset(e.label for e in self._engines.values()) | {UNKNOWN_MODEL}
