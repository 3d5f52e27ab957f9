"""The server's run: enroll nodes, train round by round, evaluate centrally,
write results. Engine-agnostic: it only needs a Flower `Grid` (Flower's
simulation or deployment grid, or privfed's in-process grid)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Iterable

import torch
from flwr.app import Message
from flwr.serverapp import Grid
from rich.console import Console

from common.config import ConfigError, RunConfig, resolve_data_dir, resolve_model_name
from common.data import load_test_set, load_federation
from common.data.provenance import differing
from common.evaluation import evaluate, pick_device
from common.models import build_model
from common.records import arrays_nbytes, load_arrays, model_to_arrays
from client.privacy import BUDGET_EXHAUSTED, ledger_path
from common.privacy.plan import delta_too_large, is_private, objective_condition_problem, planned_entries
from common.records import CONFIG
from server.checkpoint import Checkpointer
from server.report import epsilon_note
from server.metered_grid import MeteredGrid
from server.polling_grid import with_polling
from server.privacy_mirror import PrivacyMirror
from server.replies import DROPPING, magnitude_problem, screened_out
from server.results import (ResultsWriter, claim_run_names, default_run_name, hold_run_folder, package_versions,
                            refuse_taken)
from server.roster import enroll
from server.strategies.chain import declared
from server.strategies.registry import build_strategy


def initial_model(config: RunConfig) -> torch.nn.Module:
    federation = load_federation(config)
    torch.manual_seed(int(config["seed"]))
    name = resolve_model_name(str(config["model"]), str(config["dataset"]))
    model = build_model(name, federation.input_shape, federation.num_classes)
    buffers = [n for n, _ in model.named_buffers()]
    if buffers:  # e.g. BatchNorm's running statistics and its int64 num_batches_tracked
        raise ConfigError(f"model {name!r} holds buffers ({', '.join(buffers[:3])}"
                          f"{', ...' if len(buffers) > 3 else ''}): "
                          "privfed's strategies treat every array of the model as a trained parameter (FedDyn, "
                          "SCAFFOLD and FedYogi step them, Opacus cannot clip them): use GroupNorm or LayerNorm, "
                          "as the built-in models do")
    return model


def spent_text(row: dict, digits: int) -> str:
    """A round row's epsilon_max; results files hold an unbounded epsilon (inf) as null."""
    eps = row["epsilon_max"]
    return f"{eps:.{digits}f}" if eps is not None and math.isfinite(eps) else "inf (no finite bound)"


def finite_text(value: float | None, digits: int) -> str:
    """A row's number; results files hold a NaN or infinite loss (a diverged model) as null."""
    return f"{value:.{digits}f}" if value is not None and math.isfinite(value) else "not finite"


def node_state_folder(config: RunConfig, grid: Grid) -> str:
    """The folder, in each node's state-dir, of this run's client ledgers (`ledger_path`): recorded in
    summary.json, it ties a finished run to its own ledgers (node-state holds every run's)."""
    run = grid.run  # Flower's grids: a Run; the in-process grid: its run id
    return ledger_path(config, {}, int(getattr(run, "run_id", run)), 0).parent.name


def extra_train_metrics(metrics) -> dict:
    """Aggregated train metrics besides the loss (e.g. pFedMe's personal-accuracy), as train_<name>. Not the
    clients' epsilon and dp-steps: their examples-weighted mean is nobody's (the mirror's rows have max and mean)."""
    skip = {"train-loss", "num-examples", "epsilon", "dp-steps"}
    return {f"train_{k.replace('-', '_')}": v for k, v in (metrics or {}).items()
            if k not in skip and isinstance(v, (int, float))}


def active_partitions(strategy) -> list[int]:
    """Partitions the strategy may still select (wrappers expose their base's)."""
    while not hasattr(strategy, "active_partitions") and hasattr(strategy, "base"):
        strategy = strategy.base
    return strategy.active_partitions() if hasattr(strategy, "active_partitions") else [0]


def retire(strategy, partition: int) -> None:
    while not hasattr(strategy, "retire") and hasattr(strategy, "base"):
        strategy = strategy.base
    strategy.retire(partition)


def delta_warning(config: RunConfig, sizes: Iterable[int]) -> str | None:
    """A warning when target-delta is no longer small: at delta >= 1/|D_i| a mechanism that publishes one
    record of D_i outright is (0, delta)-DP, so the epsilon printed guarantees nothing."""
    smallest = min(sizes, default=0)
    delta = float(config["target-delta"])
    if not is_private(config) or not delta_too_large(config, smallest):
        return None
    return (f"WARNING: target-delta = {delta:g} is at least 1/|D_i| for the smallest client ({smallest} records): "
            "at such a delta a mechanism may publish a record outright, so no epsilon of this run is a meaningful "
            f"guarantee (use delta well below {1 / smallest:.2g})")


def retire_excluded(grid, strategy, roster, log) -> None:
    """Stop selecting the nodes secure aggregation leaves out for the rest of the run (an unusable masked
    update, a withheld reveal): each selection of one would shrink a round by a client."""
    active = set(active_partitions(strategy))
    partition_of = {node: p for p, node in roster.node_of.items()}
    for node, why in grid.excluded.items():
        if partition_of.get(node) in active:
            log(f"partition {partition_of[node]} (node {node}) is left out by secure aggregation ({why}); "
                "it is no longer selected")
            retire(strategy, partition_of[node])


def account_round(planned: dict[int, list], strategy, roster, mirror: PrivacyMirror, messages, replies, log,
                  sent: set[int] | None = None) -> None:
    """Mirror the privacy each instruction spent (`planned`: `planned_by_partition`); retire refusing clients.

    Privacy is spent when an update is released. A reply without error: released, recorded. An error
    reply (a budget refusal, or a client that failed before releasing): nothing recorded. No reply (a
    timeout, a dropped node): the update may have left the client, so it is recorded (an upper bound).
    Under secure aggregation each survivor has one (synthetic) reply, a client error its own error
    reply, and a node dropped or in an aborted round none. `sent`: the nodes the instruction reached,
    where the grid left some out; None: all."""
    partition_of = {node: p for p, node in roster.node_of.items()}
    errors = {r.metadata.src_node_id: r.error for r in replies if r.has_error()}
    for msg in messages:
        node = msg.metadata.dst_node_id
        partition, error = partition_of[node], errors.get(node)
        if error is not None and error.code == BUDGET_EXHAUSTED:
            log(f"partition {partition} (node {node}) refused: {error.reason}; it is no longer selected")
            retire(strategy, partition)
        elif error is None and (sent is None or node in sent):
            mirror.record(partition, planned[partition])


def planned_by_partition(config, roster, messages) -> dict[int, list]:
    """The ledger entries each instructed partition records before it releases its update."""
    partition_of = {node: p for p, node in roster.node_of.items()}
    planned = {}
    for msg in messages:
        p = partition_of[msg.metadata.dst_node_id]
        planned[p] = planned_entries(config, msg.content[CONFIG], dataset_size=roster.num_examples[p])
    return planned


def check_accountable(config, planned: dict[int, list]) -> None:
    """ConfigError unless the run's accountant composes what its clients will charge, before anything leaves
    (a mechanism whose entries it cannot compose, e.g. a new one, would fail at the first charge)."""
    entries = next((e for e in planned.values() if e), None)
    if entries is None:
        return
    from common.privacy.ledger import PrivacyLedger

    try:
        PrivacyLedger(list(entries)).epsilon(float(config["target-delta"]), accountant=str(config["accountant"]))
    except ValueError as err:
        raise ConfigError(f"accountant = {config['accountant']!r} cannot account this run's releases: {err}") \
            from None


def in_sent_order(messages: list[Message], replies: Iterable[Message]) -> list[Message]:
    """The replies in the order of their nodes' instructions. Flower's grids return them as they arrive,
    and a float32 weighted sum depends on the order: without this two runs of one seed differ."""
    position = {m.metadata.dst_node_id: i for i, m in enumerate(messages)}
    return sorted(replies, key=lambda r: position.get(r.metadata.src_node_id, len(position)))


def secure_abort_text(report) -> str:
    """Why a secure round was aborted, with the first node it dropped (e.g. a value beyond secagg-clip)."""
    first = next((f"node {n}: {why}" for n, why in sorted(report.problems.items())), "")
    return report.aborted + (f"; the first drop, {first}" if first else "")


def divergence(arrays) -> str | None:
    """Why no client can train on the server's new global model: its own step (FedYogi's, SCAFFOLD's, an
    Upcycled extrapolation) made it non-finite, or larger than any reply may be (server/replies.py)."""
    return next((f"array {key!r} {problem}" for key, array in arrays.items()
                 if (problem := magnitude_problem(array.numpy()))), None)


def failed_replies(messages: list[Message], replies: list[Message]) -> int:
    """Train instructions answered by an error other than a budget refusal, or not at all by the timeout
    (the runner adds the replies the strategy screened out): a run with any is not quite the planned
    experiment, and its report says so (summary `failed_replies`)."""
    errors = sum(1 for r in replies if r.has_error() and r.error.code != BUDGET_EXHAUSTED)
    return errors + max(0, len(messages) - len(replies))


def instructed(grid: Grid, metered: MeteredGrid) -> set[int] | None:
    """The nodes the round's train instructions reached (None: all). Secure aggregation sends none to a
    node it leaves out (not enrolled, excluded) and none at all when too few nodes are usable."""
    if grid is metered:
        return None
    report = grid.report
    return set(report.selected) if report.round_trips else set()


def run_federation(grid: Grid, config: RunConfig, console: Console | None = None,
                   round_lines: bool = True) -> Path:
    """Run the configured federation on `grid`; return the results folder. `round_lines`: print a line per
    round (the run's notes, warnings and summary are always printed)."""
    console = console or Console(highlight=False, soft_wrap=True)  # never wrap the results path
    log = lambda text: console.print(f"privfed: {text}")  # noqa: E731
    checkpointer = Checkpointer(config, log)  # deployment: checkpoint = true needs a run-name; times the run
    results_root = Path(str(config["results-dir"])).expanduser().resolve()
    run_dir = results_root / (str(config["run-name"]) or claim_run_names(results_root, default_run_name(config),
                                                                           [""]))
    config = {**config, "run-name": run_dir.name}  # summary.json's config says which run it is
    with hold_run_folder(run_dir):  # before the check: two runs of one explicit run-name never both pass it
        if not checkpointer.resumes():  # with a checkpoint (or round 1 in flight), the run-name names the run
            refuse_taken(run_dir)
        return _federate(grid, config, console, log, checkpointer, run_dir, round_lines)


def _federate(grid: Grid, config: RunConfig, console: Console, log, checkpointer: Checkpointer,
              run_dir: Path, round_lines: bool) -> Path:
    metered = MeteredGrid(with_polling(grid, float(config["poll-interval"])))  # short poll on Flower's grids
    federation = load_federation(config)  # cached per process: the clients' own load reuses it
    for line in differing(federation.meta.get("files", [])):
        log(line)
    roster = enroll(metered, int(config["num-clients"]), float(config["node-wait-timeout"]), log,
                    sizes=[client.num_train for client in federation.clients])
    log(f"enrolled {len(roster.node_of)} clients ({sum(roster.num_examples.values())} training examples)")
    if warning := delta_warning(config, roster.num_examples.values()):
        log(warning)
    if problem := objective_condition_problem(config, roster.num_examples.values()):
        raise ConfigError(problem)  # before round 1: each client's charge would fail on it

    device = pick_device(str(config["server-device"]))  # the server's own, whatever the clients use
    model = initial_model(config).to(device)
    x_test, y_test = load_test_set(config)
    arrays = model_to_arrays(model)
    dropped: list[str] = []  # why the strategy dropped its first reply (the error if none was ever usable)
    screened = [0]  # this round's replies the strategy dropped that were not error replies

    def strategy_log(text: str) -> None:
        if text.startswith(DROPPING) and not dropped:
            dropped.append(text)
        screened[0] += screened_out(text)
        log(text)
    strategy = build_strategy(config, roster, strategy_log)
    mirror = PrivacyMirror(config, roster.partitions)
    grid_for_strategy: Grid = metered
    if config["secure-aggregation"]:  # strategy -> SecureAggregationGrid -> MeteredGrid -> grid
        from server.secagg_grid import SecureAggregationGrid, unit_records_for

        if declared(strategy, "needs_individual_replies", False):
            log(f"secure aggregation refused: strategy {config['strategy']!r} needs individual replies")
            raise ValueError(f"secure-aggregation = true cannot run strategy {config['strategy']!r}: it needs "
                             "the individual replies, secure aggregation only yields their weighted sum")
        grid_for_strategy = SecureAggregationGrid(metered, config, log=log,
                                                  unit_records=unit_records_for(strategy, str(config["strategy"])),
                                                  sizes={roster.node_of[p]: n for p, n in roster.num_examples.items()})
        grid_for_strategy.enroll(float(config["node-wait-timeout"]))
    # an unreadable checkpoint must not cost the interrupted run's rows: reset only once it has been read
    writer = ResultsWriter(run_dir.parent, run_dir.name)
    initial_loss, initial_accuracy = evaluate(model, x_test, y_test, device)
    # (None, 1) unless resuming; the ledger reports tell which clients a lost round never reached
    resumed, first_round = checkpointer.resume(strategy, mirror, writer, arrays, roster.ledger_tails,
                                               roster.enrolled_at)
    if resumed is None:
        writer.reset()
    # ALI-DPFL's t follows the mirror, which counts a lost round (a resume, or a restart after round 1 was lost)
    if sync := declared(strategy, "sync_with_mirror", None):
        sync(mirror)
    arrays = arrays if resumed is None else resumed

    def cannot_go_on() -> str | None:
        """Why no further round can run (checked before each; the round before it is the run's last)."""
        active = len(active_partitions(strategy))
        if not active:
            return "no client can train (each spent its privacy budget or was left out by secure aggregation)"
        if grid_for_strategy is not metered and active < int(config["secagg-min-survivors"]):
            return (f"only {active} client(s) can still train (the others spent their privacy budget or were left "
                    f"out), fewer than a secure round needs (secagg-min-survivors = "
                    f"{config['secagg-min-survivors']})")
        return None

    num_rounds = int(config["num-rounds"])
    updated, failure, refusal = resumed is not None, "", ""  # the first client error; the first budget refusal
    aborted = ""  # why secure aggregation first aborted a round
    diverged = None
    for server_round in range(first_round, num_rounds + 1):
        metered.reset()
        screened[0] = 0
        t0 = time.perf_counter()
        if why := cannot_go_on():
            log(f"{why}; ending the run after round {server_round - 1}")
            break
        messages = list(strategy.configure_train(server_round, arrays, checkpointer.train_config(), grid_for_strategy))
        planned = planned_by_partition(config, roster, messages)
        if server_round == first_round:
            check_accountable(config, planned)
        checkpointer.begin_round(server_round, planned)
        replies = in_sent_order(messages, grid_for_strategy.send_and_receive(messages,
                                                                             timeout=float(config["round-timeout"])))
        sent = instructed(grid_for_strategy, metered)
        account_round(planned, strategy, roster, mirror, messages, replies, log, sent)
        if sent is not None and (unsent := declared(strategy, "not_sent", None)):  # e.g. ALI-DPFL's t
            unsent([p for p, node in roster.node_of.items() if node not in sent and p in planned])
        if grid_for_strategy is not metered:
            retire_excluded(grid_for_strategy, strategy, roster, log)
        aggregated, train_metrics = strategy.aggregate_train(server_round, replies)
        failure = failure or next((r.error.reason for r in replies
                                   if r.has_error() and r.error.code != BUDGET_EXHAUSTED), "")
        refusal = refusal or next((r.error.reason for r in replies
                                   if r.has_error() and r.error.code == BUDGET_EXHAUSTED), "")
        if grid_for_strategy is not metered and not aborted and grid_for_strategy.report.aborted:
            aborted = secure_abort_text(grid_for_strategy.report)
        if aggregated is not None:
            arrays, updated = aggregated, True
            if diverged := divergence(arrays):
                checkpointer.mark_diverged(server_round, diverged)  # before anything else: resuming is refused
        elif metered.messages_down:
            log(f"round {server_round}: no usable reply; the global model is unchanged")
        load_arrays(model, arrays)
        eval_every = int(config["eval-every"])  # > 1 (ALI-DPFL CPU suites): rows in between carry the last values
        evaluated = eval_every == 1 or server_round % eval_every == 0 or server_round == num_rounds \
            or cannot_go_on() is not None or diverged is not None  # the run's last round is always evaluated
        if evaluated:
            loss, accuracy = evaluate(model, x_test, y_test, device)
        elif server_round == first_round:  # a resumed run carries the checkpoint's last row
            loss, accuracy = ((writer.rows[-1]["loss"], writer.rows[-1]["accuracy"]) if writer.rows
                              else (initial_loss, initial_accuracy))
        row = {
            "round": server_round, "accuracy": accuracy, "loss": loss,
            "seconds": time.perf_counter() - t0, "bytes_up": metered.bytes_up, "bytes_down": metered.bytes_down,
            "clients": metered.messages_down, "failed": failed_replies(messages, replies) + screened[0],
            "train_loss": None if train_metrics is None else train_metrics.get("train-loss"),
            **extra_train_metrics(train_metrics),
            **mirror.round_metrics(),
        }
        if hasattr(strategy, "extra_round_metrics"):  # e.g. ALI-DPFL's tau and mu estimates
            row.update(strategy.extra_round_metrics())
        if eval_every > 1:
            row["evaluated"] = evaluated
        if grid_for_strategy is not metered and metered.messages_down:  # count clients, not protocol messages
            report = grid_for_strategy.report
            used = len(report.survivors) if aggregated is not None else 0  # an aborted or unusable sum: none
            row.update(clients=len(report.selected), secagg_survivors=len(report.survivors),
                       secagg_round_trips=report.round_trips, failed=len(report.selected) - used)
        writer.add_round(row)
        spent = f"  epsilon {spent_text(row, 3)} (delta {row['delta']:g}, {row['accountant']})" \
            if "epsilon_max" in row else ""
        if round_lines:
            console.print(f"round {server_round:>4}/{num_rounds}  accuracy {accuracy:.4f}  loss {loss:.4f}  "
                          f"clients {row['clients']}{spent}  {row['seconds']:.2f} s")
        if diverged:  # not checkpointed, and marked beside the checkpoint: the same command again is refused
            log(f"round {server_round}: the global model diverged ({diverged}); no client can train on it, "
                "so the run ends here (lower the learning rates)")
            break
        checkpointer.save(server_round, arrays, strategy, mirror, writer)

    if not updated:  # e.g. an unwritable state-dir, a spent budget: the run must not look like a result
        why = (f"clients failed: {failure}" if failure else f"clients refused: {refusal}" if refusal
               else f"secure aggregation aborted: {aborted}" if aborted
               else f"no reply was usable; the first: {dropped[0]}" if dropped else "no client replied")
        raise RuntimeError(f"no round updated the model; {why}")
    final = writer.rows[-1]
    # a resumed run with no round left (the same command again) adds no time to what the checkpoint holds
    wall_seconds = checkpointer.wall_seconds() if first_round <= num_rounds else checkpointer.earlier_seconds
    summary = {
        # data-dir as this process resolved it ("" means $PRIVFED_DATA_DIR or ./data: which one, it says)
        "config": {**config, "data-dir": str(resolve_data_dir(config))}, "versions": package_versions(),
        "initial": {"accuracy": initial_accuracy, "loss": initial_loss},
        "final": {"accuracy": final["accuracy"], "loss": final["loss"], "round": final["round"]},
        "rounds": final["round"], "planned_rounds": num_rounds, "wall_seconds": wall_seconds,
        "model_bytes": arrays_nbytes(arrays), "clients": len(roster.node_of),
        "privacy": mirror.summary(), "data_files": federation.meta.get("files", []),
        "node_state": node_state_folder(config, grid),
        "failed_replies": sum(int(row.get("failed", 0)) for row in writer.rows),
        **({"diverged": {"round": final["round"], "why": diverged}} if diverged else {}),
    }
    if mirror.enabled:
        writer.plot_accuracy_vs_epsilon(f"{config['strategy']} on {config['dataset']}")
    writer.save_model(arrays)
    writer.plot_accuracy(f"{config['strategy']} on {config['dataset']}")
    writer.write_summary(summary)  # last: summary.json marks a finished run (repro, report)
    spent = f", epsilon {spent_text(final, 4)} at delta {final['delta']:g}" if "epsilon_max" in final else ""
    console.print(f"privfed: final accuracy {finite_text(final['accuracy'], 4)}, loss {finite_text(final['loss'], 4)}"
                  f"{spent}")
    if mirror.enabled:
        console.print(f"privfed: {epsilon_note(summary)}")
    if warning:
        console.print(f"privfed: {warning}")
    console.print(f"privfed: results in {writer.run_dir}")
    return writer.run_dir
