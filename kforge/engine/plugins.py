"""Turn a proposer or evaluator name from the CLI or config into an object.

A name is either built in (proposers: library, llm, both; evaluator: gpu, on this machine's GPUs or
a Ray cluster's) or ``module:function``, a factory that takes a ``SearchContext``; that is how test
doubles and users' own proposers plug in.

A ``module:function`` is code, and a session's stored settings are data (a database may be
someone else's): a plug-in named only by the session is imported once the user confirms it
(``PluginConsent``: the same spec given again, their config file's, or ``--trust-plugins``). What a
user confirmed passes to a process kforge starts for them (a detached engine) as it was given,
never as more: the database may name other plug-ins by the time that process reads it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kforge.core.protocols import Evaluator, Proposer, SearchContext
from kforge.core.settings import LlmSection, Origin, SearchSettings, Settings
from kforge.errors import KforgeError


def load_factory(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise KforgeError(f"{spec!r} is not of the form module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise KforgeError(f"cannot import {module_name!r} for {spec!r}: {exc}") from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the module's own code failed (or exited) as it was imported
        raise KforgeError(f"cannot import {module_name!r} for {spec!r}: importing it raised "
                          f"{type(exc).__name__}: {exc}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise KforgeError(f"{module_name!r} has no {attr!r}") from None


@dataclass(frozen=True)
class PluginConsent:
    """The ``module:function`` plug-ins and the Ray cluster the user has confirmed: those named
    on the command line, each for what it was given as (``given``: ``(what, spec)`` pairs,
    ``what`` one of proposer, evaluator, cluster), or, with ``every`` (``--trust-plugins``), any
    the session stores. (A Ray cluster's answers are unpickled: whoever runs it runs code
    here.)"""

    given: frozenset[tuple[str, str]] = frozenset()
    every: bool = False

    def options(self) -> list[str]:
        """The command-line options that confirm the same to another kforge process (a detached
        engine): ``--trust-plugins`` where the user gave it, else each spec as what it was
        given (``--proposer SPEC``...), never anything a database names by the time that
        process reads it."""
        if self.every:
            return ["--trust-plugins"]
        return [word for what, spec in sorted(self.given) for word in (f"--{what}", spec)]

    def unconfirmed(self, search: SearchSettings, stored: Mapping[str, Any],
                    configured: SearchSettings) -> list[tuple[str, str]]:
        """``(what, spec)`` for each plug-in (``proposer``, ``evaluator``) and the cluster
        (``cluster``) of ``search`` that only the session's stored search settings (``stored``)
        name: not confirmed, and not the user's own config file's (``configured``)."""
        found = []
        for what in ("proposer", "evaluator", "cluster"):
            spec = getattr(search, what)
            named = ":" in spec if what != "cluster" else bool(spec)
            if (named and stored.get(what) == spec and not self.every
                    and (what, spec) not in self.given and spec != getattr(configured, what)):
                found.append((what, spec))
        return found

    def check(self, search: SearchSettings, stored: Mapping[str, Any],
              configured: SearchSettings) -> None:
        """Refuse the plug-ins and the cluster of ``search`` that are ``unconfirmed``."""
        unconfirmed = self.unconfirmed(search, stored, configured)
        if unconfirmed:
            what, spec = unconfirmed[0]
            raise KforgeError(
                f"the session names the {what} {spec!r}, "
                + ("code that kforge would import" if what != "cluster" else
                   "a Ray cluster kforge would send its work to and take answers (Python "
                   "objects) from")
                + f" on the database's say-so; to use it, give `--{what} {spec}` again "
                "or `--trust-plugins`")


def settled_search(session_settings: Mapping[str, Any], given: Mapping[str, Any],
                   config: Settings, origin: Origin) -> SearchSettings:
    """The search settings a session's search runs with: those ``given`` on the command line
    over those the session stored (its ``settings``), over the config file's. The stored table
    is taken as it is: a key an older session left out takes the config's value."""
    return config.search.updated({**(session_settings.get("search") or {}), **given}, origin)


def needs_consent(session_id: int, session_settings: Mapping[str, Any], config: Settings,
                  consent: PluginConsent = PluginConsent()) -> list[tuple[str, str]]:
    """``(what, spec)`` for each plug-in and cluster that resuming the session's search (with no
    search options given) would use on the database's say-so alone, unconfirmed by ``consent``:
    what ``kforge resume`` refuses without ``--trust-plugins``, by the settling and the rule it
    applies (``settled_search``, ``PluginConsent.unconfirmed``). Empty where nothing needs it."""
    search = settled_search(session_settings, {}, config, Origin.stored(session_id))
    return consent.unconfirmed(search, session_settings.get("search") or {}, config.search)


BUILTIN_PROPOSERS = ("library", "llm", "both")
BUILTIN_EVALUATORS = ("gpu",)


def check_spec(spec: str, builtins: tuple[str, ...], what: str) -> None:
    """Fail early, before anything is saved or started, on a name that cannot be loaded."""
    if ":" in spec:
        load_factory(spec)
    elif spec not in builtins:
        raise KforgeError(f"unknown {what} {spec!r}: use {', '.join(builtins)} or module:function")


def check_can_start(search: SearchSettings, llm: LlmSection, llm_model: str | None = None) -> None:
    """Fail, before a session is profiled or its settings saved, where the search could not start:
    a plug-in that cannot be loaded, the GPU evaluator without a GPU (on a Ray cluster: without
    Ray), an LLM proposer without an endpoint (``llm`` is the config file's ``[llm]``,
    ``llm_model`` the session's own model)."""
    check_spec(search.proposer, BUILTIN_PROPOSERS, "proposer")
    check_spec(search.evaluator, BUILTIN_EVALUATORS, "evaluator")
    if search.cluster and search.evaluator != "gpu":
        raise KforgeError(f"a Ray cluster ([search] cluster, --cluster) runs the gpu "
                          f"evaluator's workers, not the plug-in {search.evaluator!r}")
    if search.cluster:
        from kforge.eval.process.cluster import check_reachable, require_ray

        require_ray()  # the GPUs are the cluster's: this machine needs none
        check_reachable(search.cluster)
    elif search.evaluator == "gpu":
        from kforge.runtime.gpuinfo import require_cuda

        require_cuda()
    if search.proposer in ("llm", "both"):
        from kforge.propose.llm.settings import load_llm_settings
        from kforge.store.config import config_path

        load_llm_settings(llm, os.environ, llm_model, config_file=str(config_path()))


def make_plugin(spec: str, ctx: SearchContext, kind: type, what: str) -> Any:
    """What the factory ``spec`` (module:function) makes for ``ctx``, which must be a ``kind``:
    a factory that fails or makes something else is one KforgeError naming it."""
    factory = load_factory(spec)
    try:
        made = factory(ctx)
    except (KforgeError, KeyboardInterrupt):
        raise
    except BaseException as exc:  # sys.exit() in a factory is a failure of it too
        raise KforgeError(f"the {what} factory {spec} raised {type(exc).__name__}: "
                          f"{exc}") from None
    if not isinstance(made, kind):
        raise KforgeError(f"the {what} factory {spec} returned {type(made).__name__}, which "
                          f"is no {what} (one has the methods of "
                          f"kforge.core.protocols.{kind.__name__})")
    return made


def make_proposer(spec: str, ctx: SearchContext) -> Proposer:
    if ":" in spec:
        return make_plugin(spec, ctx, Proposer, "proposer")
    from kforge.propose import resolve_proposer

    return resolve_proposer(spec, ctx)


def make_evaluator(spec: str, ctx: SearchContext) -> Evaluator:
    if ":" in spec:
        return make_plugin(spec, ctx, Evaluator, "evaluator")
    check_spec(spec, BUILTIN_EVALUATORS, "evaluator")
    if ctx.settings.search.cluster:
        from kforge.eval.process.cluster import make_cluster_evaluator

        return make_cluster_evaluator(ctx)
    from kforge.eval import make_gpu_evaluator

    return make_gpu_evaluator(ctx)
