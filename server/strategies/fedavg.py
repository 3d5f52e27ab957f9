"""FedAvg on Flower's strategy, with privfed's seeded client sampling and
reply screening. Other strategies reuse this by mixing in `RosterSampling`."""

from __future__ import annotations

from typing import Callable, Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.serverapp.strategy import FedAvgM as FlowerFedAvgM
from flwr.serverapp.strategy import QFedAvg as FlowerQFedAvg
from flwr.serverapp.strategy.fedopt import FedOpt as FlowerFedOpt  # not exported

from client.updates.acknowledged import ACKNOWLEDGED
from server.replies import DROPPING, screen
from server.roster import Roster
from server.sampling import sample_partitions
from server.stragglers import straggler_epochs


class RosterSampling:
    """Sample partitions from (seed, training round) and address their nodes.

    For use with Flower strategies (`FedAvg` and subclasses): replaces their
    `random.sample` of node ids, and screens replies before they aggregate.
    Each sampled node gets its own message: stragglers (`setup_stragglers`)
    carry their shortened `local-epochs`; every instruction carries
    `train-round`, the index that keys client draws and local training seeds.
    Strategies whose clients keep state in step with the server's
    (`acknowledges = True`: SCAFFOLD, FedDyn) also send each node the last
    round whose reply from it they aggregated (`acknowledge`), so that the node
    keeps only the state of replies that arrived (client/updates/acknowledged.py).
    """

    acknowledges = False

    def setup_sampling(self, roster: Roster, seed: int, fraction: float, log=print) -> None:
        self.roster, self.seed, self.fraction, self.log = roster, seed, fraction, log
        self._sent: ArrayRecord | None = None
        self._partition_of = {node: p for p, node in roster.node_of.items()}
        self.round_map: Callable[[int], int] | None = None  # set by wrappers (Upcycled)
        self.stragglers, self.local_epochs = 0.0, 1
        self.retired: set[int] = set()
        self.acknowledged: dict[int, int] = {}  # partition -> last server round its reply was aggregated in

    # checkpoint protocol (server/checkpoint.py): every plain-data attribute (arrays, ArrayRecords,
    # numbers, containers of those) is saved and restored; node-id maps are rebuilt from the new roster.
    # Strategies with other state override both and extend: {**super().state_dict(), ...}.
    checkpoint_exclude = frozenset({"_partition_of"})

    def state_dict(self) -> dict:
        from server.checkpoint import auto_state

        return auto_state(self, self.checkpoint_exclude)

    def load_state_dict(self, state: dict) -> None:
        from server.checkpoint import load_auto_state

        load_auto_state(self, state)

    def retire(self, partition: int) -> None:
        """Stop selecting a partition (its client refused: privacy budget spent)."""
        self.retired.add(partition)

    def active_partitions(self) -> list[int]:
        return [p for p in self.roster.partitions if p not in self.retired]

    def sample(self, train_round: int) -> list[int]:
        """The partitions of a training round: fraction-train of all clients, drawn from the active ones."""
        return sample_partitions(self.seed, train_round, self.active_partitions(), self.fraction,
                                 population=len(self.roster.partitions))

    def setup_stragglers(self, fraction: float, local_epochs: int) -> None:
        """Each sampled client straggles with probability `fraction` (see server/stragglers.py)."""
        self.stragglers, self.local_epochs = fraction, local_epochs

    def train_round_index(self, server_round: int) -> int:
        """The index that keys client draws; wrappers (Upcycled) map rounds to it via `round_map`."""
        return server_round if self.round_map is None else self.round_map(server_round)

    def round_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        out = ConfigRecord(dict(config))
        out["server-round"] = server_round
        out["train-round"] = self.train_round_index(server_round)
        return out

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        train_round = self.train_round_index(server_round)
        partitions = self.sample(train_round)
        short = straggler_epochs(self.seed, train_round, partitions, self.stragglers, self.local_epochs)
        self._sent = arrays
        self.keep_current_arrays(arrays)
        common = self.round_config(server_round, config)
        messages = []
        for p in partitions:
            node_config = ConfigRecord(dict(common))
            if p in short:
                node_config["local-epochs"] = short[p]
            if self.acknowledges:
                node_config[ACKNOWLEDGED] = self.acknowledged.get(p, 0)
            record = RecordDict({self.arrayrecord_key: arrays, **self.extra_records(server_round),
                                 self.configrecord_key: node_config})
            messages.extend(self._construct_messages(record, [self.roster.node_of[p]], MessageType.TRAIN))
        return messages

    def acknowledge(self, server_round: int, aggregated: Iterable[Message]) -> None:
        """The replies of `aggregated` (under secure aggregation: one per survivor) entered the new model."""
        for msg in aggregated:
            p = self._partition_of.get(msg.metadata.src_node_id)
            if p is not None:
                self.acknowledged[p] = server_round

    def keep_current_arrays(self, arrays: ArrayRecord) -> None:
        """Record the model the server steps from, as the Flower strategy's own `configure_train` (which
        this one replaces) does: FedOpt's (FedAdam, FedAdagrad, FedYogi) as numpy arrays, FedAvgM's and
        QFedAvg's as an ArrayRecord. Every round: a wrapper (Upcycled) moves the model in between."""
        if isinstance(self, FlowerFedOpt):
            self.current_arrays = {k: a.numpy() for k, a in arrays.items()}
        elif isinstance(self, (FlowerFedAvgM, FlowerQFedAvg)):
            self.current_arrays = arrays.copy()

    def extra_records(self, server_round: int) -> dict:
        """Records sent to every sampled node besides the model and config (SCAFFOLD: the global control)."""
        return {}

    def screened(self, replies: Iterable[Message]) -> list[Message]:
        return screen(self.from_roster(replies), self._sent, self._max_examples, self.log)

    def from_roster(self, replies: Iterable[Message]) -> list[Message]:
        """The replies of this run's nodes (and error replies: the SuperLink answers for a node). Flower's
        grids pass only replies to instructions; another grid might not."""
        known = []
        for msg in replies:
            if msg.has_error() or msg.metadata.src_node_id in self._partition_of:
                known.append(msg)
            else:
                self.log(f"{DROPPING} from node {msg.metadata.src_node_id}: not a node of this run")
        return known

    def _max_examples(self, node: int) -> int | None:
        p = self._partition_of.get(node)  # None: an error reply from the SuperLink (it answers for a node)
        return None if p is None else self.roster.num_examples[p]


class FedAvg(RosterSampling, FlowerFedAvg):
    def __init__(self, roster: Roster, seed: int, fraction_train: float, log=print):
        super().__init__(fraction_train=fraction_train, fraction_evaluate=0.0,
                         min_available_nodes=len(roster.node_of))
        self.setup_sampling(roster, seed, fraction_train, log)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        return super().aggregate_train(server_round, self.screened(replies))
