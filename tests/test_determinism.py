"""Reproducibility: the same config and seed give the same numbers (for any `--workers`, any reply
arrival order, after a resume), local randomness is keyed by (run seed, partition, round), and DP noise
is never reused. Each test is a defect an adversarial review found (session 12). Across engines with
different torch thread counts the numbers agree to float rounding only (README, in-process engine).
"""

import io
import multiprocessing

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity
from rich.console import Console

import client.node
from client.node import local_client
from common.config import validate
from common.records import ARRAYS, CONFIG, model_to_arrays
from server.inprocess import run_inprocess
from server.inprocess_grid import InProcessGrid
from server.runner import initial_model, run_federation
from fault_grids import DiesAfter, Killed

# the configuration of tests/test_e2e_flower.py (the engine-parity check), on the generated federation
RUN = {"num-clients": 3, "num-rounds": 3, "seed": 3, "dataset": "synthetic"}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def node(tmp_path, partition: int = 0, **run_config) -> Context:
    """A node's Context as the engines build it (run_id 7)."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, SUPERLINK_NODE_ID, 7
    config = dict(validate({**RUN, "state-dir": str(tmp_path / "state"), "results-dir": str(tmp_path), **run_config}))
    return Context(run_id=7, node_id=1000 + partition, node_config={"partition-id": partition,
                   "num-partitions": config["num-clients"]}, state=RecordDict(), run_config=config)


def instruction(config, server_round: int = 1) -> RecordDict:
    """A first-round train instruction carrying the run's initial global model."""
    return RecordDict({ARRAYS: model_to_arrays(initial_model(config)),
                       CONFIG: ConfigRecord({"server-round": server_round, "train-round": server_round})})


def flat(arrays) -> np.ndarray:
    return np.concatenate([a.numpy().ravel() for a in arrays.values()])


def in_process(cfg, grid_wrapper=None, run_id: int = 5):
    client.node._local.clear()  # each run: fresh client processes
    with InProcessGrid("client.app:app", dict(cfg), int(cfg["num-clients"]), run_id=run_id) as grid:
        return run_federation(grid if grid_wrapper is None else grid_wrapper(grid), cfg, Console(file=io.StringIO()))


def model_of(results) -> dict[str, np.ndarray]:
    with np.load(results / "model.npz") as z:
        return {k: z[k] for k in z.files}


def assert_bit_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    differing = {k: int((a[k] != b[k]).sum()) for k in a if not np.array_equal(a[k], b[k])}
    worst = max((float(np.abs(a[k] - b[k]).max()) for k in differing), default=0.0)
    assert not differing, f"entries that differ per array: {differing} (largest difference {worst:.3g})"


# --- 1. hidden global RNG: nn.Dropout in the femnist-mlp model ------------------------------------------
def train_through_the_app(context, content) -> np.ndarray:
    """One train message through the ClientApp, as every engine delivers it."""
    from uuid import uuid4

    from flwr.app import Message

    from server.inprocess_grid import deliver, load_client_app

    msg = Message(content, context.node_id, "train", group_id="1")
    for key, value in (("_message_id", str(uuid4())), ("_run_id", 7), ("_src_node_id", SUPERLINK_NODE_ID)):
        msg.metadata.__dict__[key] = value
    reply = deliver(load_client_app("client.app:app"), msg, context)
    assert not reply.has_error(), reply.error.reason
    return flat(reply.content[ARRAYS])


def test_local_training_of_a_dropout_model_does_not_depend_on_the_global_torch_rng(tmp_path):
    """femnist-mlp has Dropout(0.5), whose masks come from torch's global RNG: the same instruction
    trained twice gave two updates depending on what else had used it before (other clients in the
    same process, another engine's process, a resumed server). The ClientApp now keys it by (run seed,
    partition, training round) for the rule's duration."""
    context = node(tmp_path, model="femnist-mlp")
    content = instruction(local_client(context).config)
    torch.manual_seed(0)
    first = train_through_the_app(context, content)
    torch.manual_seed(1)
    second = train_through_the_app(context, content)
    assert np.array_equal(first, second), f"max difference {np.abs(first - second).max():.3g}"


def test_a_resumed_run_of_a_dropout_model_ends_with_the_uninterrupted_model(tmp_path):
    """Resume = uninterrupted held bit for bit for every strategy with the default model, but not for
    femnist-mlp: the resumed
    ServerApp re-seeds torch's global RNG (initial_model's torch.manual_seed), so the dropout masks of the
    resumed rounds replay the stream from round 1. Measured: 13,358 of 13,926 weights differ, by up to 0.088,
    after 4 rounds (killed as round 3 left)."""
    base = {**RUN, "num-rounds": 4, "model": "femnist-mlp", "checkpoint": True,
            "results-dir": str(tmp_path / "results"), "state-dir": str(tmp_path / "state")}
    whole = in_process(validate({**base, "run-name": "whole"}), run_id=1)
    part = validate({**base, "run-name": "part"})
    with pytest.raises(Killed):
        in_process(part, lambda grid: DiesAfter(grid, 2), run_id=2)
    resumed = in_process(part, run_id=3)
    assert_bit_identical(model_of(whole), model_of(resumed))


# --- 2. the in-process engine's workers use the run's thread count ----------------------------------
def _run_with_workers(cfg, workers):
    client.node._local.clear()
    return model_of(run_inprocess(cfg, workers=workers, console=Console(file=io.StringIO())))


def test_inprocess_results_do_not_depend_on_the_number_of_workers(tmp_path, monkeypatch):
    """server/inprocess_grid.py: "Results do not depend on `workers`". With workers = N each worker gets
    cpu_count // N torch threads, workers = 1 runs with 1: on a 4-core machine `--workers 2` gives 2
    threads per client and other numbers (measured: max |difference| 3e-8 after 2 rounds)."""
    cfg = dict(RUN, **{"num-rounds": 2, "model": "adult-mlp", "batch-size": 64, "local-epochs": 2,
                       "results-dir": str(tmp_path)})
    alone = _run_with_workers(validate({**cfg, "run-name": "w1"}), 1)
    monkeypatch.setattr(multiprocessing, "cpu_count", lambda: 4)  # a 4-core machine
    pooled = _run_with_workers(validate({**cfg, "run-name": "w2"}), 2)
    assert_bit_identical(alone, pooled)


# --- 3. the aggregate depends on the order replies arrive in -------------------------------------------
class ArrivalOrder:
    """A grid whose train replies come back in another order than the instructions went out, as they do
    from Flower's grids (PollingGrid collects them as they arrive, pulling a `set` of message ids)."""

    def __init__(self, inner):
        self.inner = inner

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        replies = list(self.inner.send_and_receive(messages, timeout=timeout))
        return replies[::-1] if messages and messages[0].metadata.message_type == "train" else replies

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("strategy", ["fedavg", "fedyogi", "scaffold", "pfedme"])
def test_the_global_model_does_not_depend_on_the_order_replies_arrive_in(tmp_path, strategy):
    """Flower's FedAvg sums `value * weight` reply by reply in list order (float32: not associative), and
    neither the runner nor the strategies put the replies in a fixed order. Under Flower the order is the
    arrival order, so two `flwr run`s of one config (dp-noise-seed = 'run-seed': "bit-reproducible") and
    `flwr run` vs the in-process engine differ. Measured with 3 clients, 3 rounds: 279-361 weights differ
    (up to 3.6e-6 for SCAFFOLD); the `flwr run` of tests/test_e2e_flower.py equals `run_inprocess(threads=2)`
    with round 2's replies in order (1, 2, 0) or (2, 1, 0), not (0, 1, 2)."""
    cfg = validate({**RUN, "strategy": strategy, "results-dir": str(tmp_path)})
    in_order = in_process(cfg.replace(**{"run-name": "in-order"}))
    arrived = in_process(cfg.replace(**{"run-name": "arrived"}), ArrivalOrder)
    assert_bit_identical(model_of(in_order), model_of(arrived))


# --- 4. FedLAP-DP reuses DP noise across rounds --------------------------------------------------------
def test_fedlap_dp_never_reuses_the_noise_of_a_gradient_access_in_another_round(tmp_path, monkeypatch):
    """Each FedLAP-DP real-gradient access draws its noise and Poisson-sampling seed as a 31-bit integer
    (`torch.randint(0, 2**31 - 1)`, client/updates/fedlap.py synthesise). At the paper's loop sizes
    (fedlap-dp-paper: R_i 4 x 5 outer x N 10 = 200 accesses per client and round, 5 clients, 30 rounds:
    30,000 accesses) two accesses share a seed with probability ~19% per run, and then their DP-SGD
    noise vectors and sampled batches are identical: the accountant composes them as independent
    Gaussian mechanisms. Here (seed 1, run-seed noise) partition 1 passes seed 1291092078 to private_gradient in round 7
    (access 178) and again in round 15 (access 125)."""
    import common.privacy.dpsgd as dpsgd
    from client.updates.fedlap import fedlap_update

    used: list[int] = []

    def recording(model, x, y, *, seed=None, **kw):  # the noise and sampling of one access are keyed by seed
        used.append(seed)
        return [torch.zeros_like(p) for p in model.parameters() if p.requires_grad]

    monkeypatch.setattr(dpsgd, "private_gradient", recording)
    loop = {"strategy": "fedlap", "privacy": "dpsgd", "dp-noise-seed": "run-seed", "seed": 1, "num-clients": 5,
            "num-rounds": 30, "fedlap-restarts": 4, "fedlap-max-outer": 5, "fedlap-real-batches": 10,
            "fedlap-model-steps": 2, "fedlap-image-steps": 1, "fedlap-radius": 1e9, "fedlap-dsa": False,
            "fedlap-ipc": 1, "dp-sample-rate": 0.1, "synthetic-dim": 5, "synthetic-classes": 3}
    context = node(tmp_path, partition=1, **loop)
    client_ = local_client(context)
    seeds = {}
    for server_round in (7, 15):
        used.clear()
        fedlap_update(client_, instruction(client_.config, server_round), RecordDict())
        seeds[server_round] = list(used)
    assert len(seeds[7]) == len(seeds[15]) == 200
    shared = set(seeds[7]) & set(seeds[15])
    assert not shared, (f"rounds 7 and 15 of partition 1 reuse DP noise seeds {sorted(shared)} "
                        f"(accesses {[seeds[7].index(s) for s in shared]} and {[seeds[15].index(s) for s in shared]})")
