"""The policy interface over decision points, and the registries that higher layers fill.

A policy answers a :class:`~hexagent_gym.planning.decisions.DecisionPoint` one pick at a time. The
core names no policy, saved-model format or env of its own: packages *plug in* through the
``hexagent_gym.plugins`` entry-point group of their distribution (this project's
``hexagent_gym.agents`` and ``hexagent_gym.envs`` declare theirs in ``pyproject.toml``), each entry
a function that calls
:func:`register_policy`, :func:`register_model_loader` or :func:`register_env`. Plugins load once,
on the first lookup, so importing the core stays light; a third-party package adds policies the
same way.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from hexagent_gym.registry import Registry

if TYPE_CHECKING:
    from hexagent_gym.planning.decisions import DecisionPoint
    from hexagent_gym.sim.metrics import EpisodeResult
    from hexagent_gym.sim.simulator import Simulator


@runtime_checkable
class Policy(Protocol):
    """What the simulator and the env need from a scheduler."""

    name: str

    def reset(self, sim: Simulator) -> None:
        """Called once before an episode starts (drop per-episode state)."""

    def pick(self, dp: DecisionPoint) -> tuple[int, int, int]:
        """Return (call slot, prefill instance, decode instance) for the next-ranked call."""

    # Optional: ``decide(dp)``, called first at every decision point by :func:`run_policy`,
    # may make picks itself (``dp.pick``) — e.g. a whole computed ranking at once — and
    # ``pick`` answers the calls it leaves. It must pick exactly what ``pick`` would have.
    # Optional: ``pause_gc = False`` for a policy that drops reference cycles while it decides
    # (``run_policy`` otherwise pauses the garbage collector for the episode: Engine.run).


PLUGIN_GROUP = "hexagent_gym.plugins"
_POLICIES = Registry("policy")
_LOADERS = Registry("saved-model format")
_ENVS = Registry("env")
_plugins_loaded = False


def load_plugins() -> None:
    """Run every ``hexagent_gym.plugins`` entry point once (idempotent).

    Raises:
        RuntimeError: no plugin is installed: the package metadata is missing or stale (an
            editable install made before the entry points existed); reinstall with
            ``pip install -e .``.
    """
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    found = list(entry_points(group=PLUGIN_GROUP))
    if not found:
        raise RuntimeError(f"no '{PLUGIN_GROUP}' entry points are installed, so no policy or env "
                           "is registered: reinstall the package (pip install -e .)")
    for ep in sorted(found, key=lambda e: e.name):
        ep.load()()


def register_policy(name: str, entry_point: str | Callable[..., Policy]) -> None:
    """Register a policy factory under ``name`` (``"module:attr"`` or a callable).

    Raises:
        ValueError: the name is taken (re-registering silently would hide typos and clashes).
    """
    _POLICIES.register(name, entry_point)


def policy_names() -> list[str]:
    """Registered policy names, sorted."""
    load_plugins()
    return _POLICIES.names()


def make_policy(name: str, **kwargs: Any) -> Policy:
    """Instantiate a registered policy by name (case-insensitive).

    Raises:
        ValueError: unknown name; the message lists the known ones and the closest match.
    """
    load_plugins()
    return _POLICIES.factory(name)(**kwargs)


def register_model_loader(suffix: str, loader: str | Callable[[Path], Any]) -> None:
    """Register how saved models with file suffix ``suffix`` (e.g. ``".zip"``) are loaded."""
    _LOADERS.register(suffix, loader)


def load_saved(path: str | Path) -> Any:
    """Load a saved model (an object with ``predict``) by its file suffix.

    Raises:
        ValueError: no loader for the suffix (the message lists the known ones).
    """
    load_plugins()
    path = Path(path)
    return _LOADERS.factory(path.suffix or ".zip")(path)


def register_env(name: str, factory: str | Callable[..., Any]) -> None:
    """Register the factory behind ``hexagent_gym.make`` (``name``: its env id)."""
    _ENVS.register(name, factory)


def make_env(name: str, *args: Any, **kwargs: Any) -> Any:
    """Build a registered env (what ``hexagent_gym.make`` calls)."""
    load_plugins()
    return _ENVS.factory(name)(*args, **kwargs)


def run_policy(sim: Simulator, policy: Policy, *, close: bool = False) -> EpisodeResult:
    """Run one whole episode on the bare simulator with ``policy`` answering every decision.

    ``close``: free the episode once its result is built (``Engine.close``: the simulator is
    unusable afterwards). Pass True where the caller built both the simulator and the policy
    and hands neither out, as ``env.rollout`` with a policy name does."""
    policy.reset(sim)
    return sim.run(policy.pick, policy_name=policy.name, decide=getattr(policy, "decide", None),
                   pause_gc=getattr(policy, "pause_gc", True), close=close)
