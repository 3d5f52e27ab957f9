"""Local update rules, one module each, looked up by the run's `strategy`.

A rule takes the node's `LocalClient`, the instruction's content and the
node's persistent `Context.state`, and returns the reply content.
"""

from __future__ import annotations

import functools
import importlib
from typing import Callable

from flwr.app import ArrayRecord, MetricRecord, RecordDict

import common.config as cc  # the mechanisms' declarations, read at call time (cc.NAME, not a copy)

UpdateRule = Callable[["LocalClient", RecordDict, RecordDict], RecordDict]  # noqa: F821


# strategy -> (module, function). FedAvgM and FedYogi differ from FedAvg on the
# server only; Upcycled-FL wraps the server strategy and keeps the base's rule.
RULES = {
    "fedavg": ("client.updates.sgd", "sgd_update"),
    "fedavgm": ("client.updates.sgd", "sgd_update"),
    "fedyogi": ("client.updates.sgd", "sgd_update"),
    "fedprox": ("client.updates.prox", "prox_update"),
    "scaffold": ("client.updates.scaffold", "scaffold_update"),
    "feddyn": ("client.updates.feddyn", "feddyn_update"),
    "pfedme": ("client.updates.pfedme", "pfedme_update"),
    "dpfedavg-hu": ("client.updates.hu_dpsgd", "hu_update"),
    "fedlap": ("client.updates.fedlap", "fedlap_update"),
    "ali-dpfl": ("client.updates.ali_paper", "ali_update"),  # DP-SGD (+ the paper's mu leak if asked)
}

# Rules that apply the run's privacy mechanism themselves (FedLAP-DP: DP-SGD gradients as matching targets).
OWN_PRIVACY = {"fedlap", "ali-dpfl"}


# The privacy mechanism replaces the base rule where it changes local training. Each is also declared,
# with the strategies whose local rule it implements, in common/config.py PRIVATE_RULE_STRATEGIES.
PRIVATE_RULES = {
    "dpsgd": ("client.updates.dpsgd", "dpsgd_update"),
}


# Upcycled-FL private variants: wrappers around the base rule (client/updates/perturbation.py). Each is
# also declared in common/config.py PRIVATE_WRAPPER_MECHANISMS.
PRIVATE_WRAPPERS = {
    "output": ("client.updates.perturbation", "output_perturbed"),
    "objective": ("client.updates.perturbation", "objective_perturbed"),
}


class UnprotectedRecord(RuntimeError):
    """The base rule's reply holds a record the wrapping mechanism does not protect: nothing is released."""


def refuse_unprotected(reply: RecordDict, privacy: str, base) -> None:
    """Refuse a base rule's reply holding any record besides the model ("arrays", which a wrapper
    perturbs) and metrics (cut to data-independent ones by client/app.py `private_release`): another
    ArrayRecord (a SCAFFOLD-like control-delta) or a ConfigRecord would leave unperturbed, outside the
    accounting. The wrapper charged the ledger before the base ran, so this over-counts (the safe
    direction); validation refuses the strategies known to reply with such records before any charge."""
    extra = sorted(name for name, record in reply.items()
                   if not (name == "arrays" and isinstance(record, ArrayRecord))  # common.records.ARRAYS (torch)
                   and not isinstance(record, MetricRecord))
    if extra:
        raise UnprotectedRecord(
            f"privacy = {privacy!r} perturbs only the model ('arrays') of the reply, but the base rule "
            f"{getattr(base, '__qualname__', base)} also replies with {extra}: released unperturbed they "
            f"would leak the local data outside the accounting, so nothing is released; use a strategy "
            f"whose rule replies with the model only")


def _model_only(base: UpdateRule, privacy: str) -> UpdateRule:
    """`base`, its reply refused if it holds a record the wrapper `privacy` does not protect: every
    PRIVATE_WRAPPERS entry gets its base rule through here, so a new wrapper is covered too."""
    @functools.wraps(base)
    def rule(client, content: RecordDict, state: RecordDict) -> RecordDict:
        reply = base(client, content, state)
        refuse_unprotected(reply, privacy, base)
        return reply
    return rule


def update_rule(strategy: str, privacy: str = "none") -> UpdateRule:
    """The rule a node runs; ValueError for a mechanism its declaration (common/config.py) does not allow
    with `strategy` (validation refuses those runs first: this holds for any caller)."""
    if privacy in PRIVATE_WRAPPERS:
        if privacy not in cc.PRIVATE_WRAPPER_MECHANISMS:
            raise ValueError(f"privacy {privacy!r} wraps the base rule (PRIVATE_WRAPPERS) but is not declared in "
                             f"common/config.py PRIVATE_WRAPPER_MECHANISMS")
        module, name = PRIVATE_WRAPPERS[privacy]
        return getattr(importlib.import_module(module), name)(_model_only(update_rule(strategy, "none"), privacy))
    if privacy in PRIVATE_RULES:
        supported = cc.PRIVATE_RULE_STRATEGIES.get(privacy, ())
        if strategy not in supported:
            raise ValueError(f"privacy {privacy!r} replaces the local update rule and has no local rule of strategy "
                             f"{strategy!r} (its correction would be dropped); common/config.py "
                             f"PRIVATE_RULE_STRATEGIES declares it for: {', '.join(supported) or 'none'}")
        if strategy not in OWN_PRIVACY:
            module, name = PRIVATE_RULES[privacy]
            return getattr(importlib.import_module(module), name)
    elif privacy != "none":
        raise ValueError(f"no rule for privacy {privacy!r}: register it in PRIVATE_RULES (it replaces the base "
                         f"rule) or PRIVATE_WRAPPERS (it wraps it), client/updates/__init__.py")
    if strategy not in RULES:
        raise ValueError(f"no local update rule for strategy {strategy!r}")
    module, name = RULES[strategy]
    return getattr(importlib.import_module(module), name)
