"""Turn a proposer or evaluator name from the CLI or config into an object.

A name is either built in (proposers: library, llm, both; evaluator: gpu, on this machine's GPUs or
a Ray cluster's) or ``module:function``, a factory that takes a ``SearchContext``; that is how test
doubles and users' own proposers plug in.

A ``module:function`` is code, and a session's stored settings are data (a database may be
someone else's): a plug-in named only by the session is imported once the user confirms it
(``PluginConsent``: the same spec given again, their config file's, or ``--trust-plugins``).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kforge.core.protocols import Evaluator, Proposer, SearchContext
from kforge.core.settings import LlmSection, SearchSettings
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
    """The ``module:function`` plug-ins the user has confirmed: those named on the command line
    (``specs``) or, with ``every`` (``--trust-plugins``), any the session stores."""

    specs: frozenset[str] = frozenset()
    every: bool = False

    def check(self, search: SearchSettings, stored: Mapping[str, Any],
              configured: SearchSettings) -> None:
        """Refuse the plug-ins of ``search`` that only the session's stored search settings
        (``stored``) name: not confirmed, and not the user's own config file's
        (``configured``)."""
        for what in ("proposer", "evaluator"):
            spec = getattr(search, what)
            if (":" in spec and stored.get(what) == spec and not self.every
                    and spec not in self.specs and spec != getattr(configured, what)):
                raise KforgeError(
                    f"the session names the {what} {spec!r}, code that kforge would import from "
                    f"the database's say-so; to run it, give `--{what} {spec}` again or "
                    "`--trust-plugins`")


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
        from kforge.eval.cluster import check_reachable, require_ray

        require_ray()  # the GPUs are the cluster's: this machine needs none
        check_reachable(search.cluster)
    elif search.evaluator == "gpu":
        from kforge.eval.gpuinfo import require_cuda

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
        from kforge.eval.cluster import make_cluster_evaluator

        return make_cluster_evaluator(ctx)
    from kforge.eval import make_gpu_evaluator

    return make_gpu_evaluator(ctx)
