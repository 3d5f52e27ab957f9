"""A node facing a curious or hostile server: it refuses instructions that would weaken its guarantee or
exhaust it, charging nothing, and a run config cannot move its files out of its state directory."""

from collections import OrderedDict
from uuid import uuid4

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from client.node import local_client
from client.secagg import RECORD
from common.config import ConfigError, validate
from common.records import ARRAYS, CONFIG, arrays_to_state_dict, model_to_arrays
from server.inprocess_grid import deliver, load_client_app

SMALL = {"dataset": "synthetic", "num-clients": 2, "synthetic-dim": 5, "synthetic-classes": 3, "seed": 3}
HU = {"strategy": "dpfedavg-hu", "hu-sigma": 2.0, "hu-local-steps": 2, "batch-size": 8}


@pytest.fixture(scope="module")
def app():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, SUPERLINK_NODE_ID, 7
    return load_client_app("client.app:app")


def node(tmp_path, **run_config):
    config = {**SMALL, **run_config, "state-dir": str(tmp_path)}
    return Context(run_id=7, node_id=1234, node_config={"partition-id": 0, "num-partitions": 2}, state=RecordDict(),
                   run_config=config)


def send(app, context, content, message_type="train"):
    msg = Message(content, 1234, message_type, group_id="1")
    for key, value in (("_message_id", str(uuid4())), ("_run_id", 7), ("_src_node_id", 1)):
        msg.metadata.__dict__[key] = value
    return deliver(app, msg, context)


def instruction(context, arrays=None, **values):
    client = local_client(context)
    return RecordDict({ARRAYS: arrays if arrays is not None else model_to_arrays(client.model),
                       CONFIG: ConfigRecord({"server-round": 1, **values})})


def refused(reply, text):
    return reply.has_error() and text in reply.error.reason


@pytest.mark.parametrize("sigma,clip,text", [(0.0, 1.0, "hu-sigma > 0"), (2.0, 0.0, "hu-clip"),
                                             (2.0, 100.0, "hu-clip")])
def test_hu_refuses_no_noise_or_another_clipping_in_a_private_run(app, tmp_path, sigma, clip, text):
    """Fixed hu-sigma, no budget: the server turned the noise off, or the clipping (rho was charged as 0)."""
    context = node(tmp_path, **HU)
    reply = send(app, context, instruction(context, **{"hu-sigma": sigma, "hu-clip": clip, "hu-accountant":
                                                        "conservative", "hu-local-steps": 2}))
    assert refused(reply, text)
    assert local_client(context).ledger.entries == ()


def test_a_run_without_secure_aggregation_refuses_to_fake_it(app, tmp_path):
    """A masked train would have earned the /r credit while the server cancels a made-up peer's mask."""
    context = node(tmp_path, **HU, **{"hu-accountant": "paper"})
    enroll = RecordDict({RECORD: ConfigRecord({"run": (5).to_bytes(8, "big"), "params": b""})})
    assert refused(send(app, context, enroll, "query.secagg_enroll"), "secure-aggregation = false")
    masked = instruction(context, **{"hu-sigma": 2.0, "hu-clip": 1.0, "hu-accountant": "paper",
                                     "hu-local-steps": 2})
    masked[RECORD] = ConfigRecord({"run": (5).to_bytes(8, "big")})
    assert refused(send(app, context, masked), "secure-aggregation = false")
    assert local_client(context).ledger.entries == ()


def test_a_private_run_releases_no_client_side_evaluation(app, tmp_path):
    context = node(tmp_path, privacy="dpsgd", **{"local-steps": 2})
    reply = send(app, context, instruction(context), "evaluate")
    assert refused(reply, "no client-side evaluation")
    plain = node(tmp_path / "plain")
    assert not send(app, plain, instruction(plain), "evaluate").has_error()


@pytest.mark.parametrize("run,asked,text", [
    ({}, {"local-epochs": 10**12}, "local-epochs"),
    ({"privacy": "dpsgd", "local-steps": 2}, {"local-steps": 10**12}, "local-steps"),
    ({"privacy": "dpsgd", "local-steps": 2, "target-epsilon": 1.0, "accountant": "pld"}, {"local-steps": 10**7},
     "local-steps"),
    ({"strategy": "fedprox", "privacy": "objective", "target-epsilon": 5.0}, {"proximal-mu": 1e9}, "proximal-mu"),
])
def test_hostile_amounts_are_refused_before_any_work(app, tmp_path, run, asked, text):
    """10**12 steps would hang the node (or exhaust its memory in the PLD accountant); a server-chosen mu
    would change the epsilon objective perturbation is charged."""
    context = node(tmp_path, **run)
    reply = send(app, context, instruction(context, **asked))
    assert refused(reply, text)
    assert local_client(context).ledger.entries == ()


@pytest.mark.parametrize("name", ["/../../escaped", "..", "a/b", "a\\b"])
def test_run_name_is_one_folder_name(name):
    """run-name names the ledger's and the snapshots' folders under the node's state directory."""
    with pytest.raises(ConfigError, match="run-name"):
        validate({"run-name": name})


# --- checked before any charge (an adversarial review, session 11) ----------------------------
def misshapen(context) -> ArrayRecord:
    return ArrayRecord(OrderedDict((k, torch.zeros(1)) for k in local_client(context).model.state_dict()))


def test_output_perturbation_never_releases_an_unclipped_update_for_a_non_finite_model(app, tmp_path):
    """output-perturb = 'update': a server that puts -inf in one bias makes that coordinate's update NaN,
    the update's norm NaN, and `max(1, NaN / tau)` = 1: the rest of the update left unclipped (norm ~33
    against output-clip 0.01), while the ledger charged a tau-clipped Gaussian release."""
    clip = 0.01
    context = node(tmp_path, privacy="output", **{"output-perturb": "update", "output-clip": clip,
                                                  "output-noise-std": 1e-6, "output-sensitivity": "ball", "lr": 0.5})
    received = OrderedDict((k, v.detach().clone()) for k, v in local_client(context).model.state_dict().items())
    bias = next(k for k in received if k.endswith("bias"))
    received[bias][0] = -float("inf")
    reply = send(app, context, instruction(context, arrays=ArrayRecord(received)))
    if reply.has_error():
        return  # refusing a non-finite model is fine
    released = arrays_to_state_dict(reply.content[ARRAYS])
    update = torch.cat([(released[k] - received[k]).reshape(-1) for k in received])
    finite = update[torch.isfinite(update)]
    assert float(finite.norm()) <= clip + 1e-3, "released an update far outside the output-clip ball"


@pytest.mark.parametrize("run,asked,bad_arrays", [
    ({"privacy": "output"}, {"local-epochs": 10**12}, False),
    ({"strategy": "fedprox", "privacy": "objective", "target-epsilon": 50.0}, {"local-epochs": 10**12}, False),
    ({"privacy": "dpsgd", "local-steps": 2}, {"server-round": -1}, False),
    (HU, {"hu-sigma": 2.0, "server-round": -1}, False),
    ({"privacy": "dpsgd", "local-steps": 2}, {}, True),
    ({"privacy": "output"}, {}, True),
], ids=["output-epochs", "objective-epochs", "dpsgd-round", "hu-round", "dpsgd-arrays", "output-arrays"])
def test_a_refused_instruction_charges_nothing(app, tmp_path, run, asked, bad_arrays):
    """An instruction the node refuses (a hostile local-epochs, a negative round, a misshapen model) releases
    nothing, so it must spend nothing: today the ledger records a release that never happened (and the
    server's mirror, seeing an error reply, records nothing)."""
    context = node(tmp_path, **run)
    reply = send(app, context, instruction(context, arrays=misshapen(context) if bad_arrays else None, **asked))
    assert reply.has_error()
    assert local_client(context).ledger.entries == ()


def test_ali_dpfl_refuses_a_hostile_local_steps_before_the_accountant(app, tmp_path):
    """ALI-DPFL's local-steps has no cap: the PLD accountant is asked to compose it (10**7 steps: ~4 s and
    ~1 GB; 10**8: ~24 s and 3.5 GB; 10**12: MemoryError on a 2.2 TiB array). The node's own config fixes
    R_c, so anything beyond it can be refused by name, as for the other DP-SGD strategies."""
    context = node(tmp_path, strategy="ali-dpfl", privacy="dpsgd", accountant="pld",
                   **{"target-epsilon": 1.0})
    reply = send(app, context, instruction(context, **{"local-steps": 10**7}))
    assert reply.has_error() and "local-steps" in reply.error.reason
    assert local_client(context).ledger.entries == ()


# --- refused before the charge (an adversarial review, session 21: each test failed on the code it reviewed):
# a charge for a release that never happened over-spends the owner's budget, and the server's mirror, seeing
# an error reply, records nothing, so node and server disagree on epsilon
FEDLAP_DP = {"strategy": "fedlap", "privacy": "dpsgd", "model": "logreg", "fedlap-ipc": 2, "fedlap-dsa": False,
             "fedlap-real-batches": 2, "fedlap-max-outer": 2, "fedlap-image-steps": 2, "fedlap-model-steps": 1,
             "target-epsilon": 50.0}


def entries(context):
    return [e.kind for e in local_client(context).ledger.entries]


@pytest.mark.parametrize("run", [
    {"strategy": "fedprox", "privacy": "output"},
    {"strategy": "fedprox", "privacy": "dpsgd", "local-steps": 2},
], ids=["upcycled-output", "dp-fedprox"])
def test_a_non_numeric_proximal_mu_is_refused_before_the_charge(app, tmp_path, run):
    """client/updates/perturbation.py output_perturbed and client/updates/dpsgd.py dpsgd_update charge first;
    the instruction's proximal-mu is parsed only afterwards (prox_update / proximal_term -> prox_mu ->
    float('abc')): ValueError, nothing released, one entry charged."""
    context = node(tmp_path, **run)
    reply = send(app, context, instruction(context, **{"proximal-mu": "abc"}))
    assert reply.has_error()
    assert entries(context) == [], "a refused instruction was charged to the ledger"


def test_a_divergent_proximal_mu_under_output_perturbation_charges_nothing(app, tmp_path):
    """Under privacy = 'output' the server's proximal-mu is taken as is (only objective perturbation pins it).
    mu = 1e30 makes local training diverge to NaN; output perturbation then refuses to clip a NaN vector
    (ValueError) after output_perturbed has charged the ledger."""
    context = node(tmp_path, strategy="fedprox", privacy="output")
    reply = send(app, context, instruction(context, **{"proximal-mu": 1e30}))
    if not reply.has_error():
        return  # releasing a (clipped, noised) model is fine
    assert entries(context) == [], f"refused ({reply.error.reason.splitlines()[0]}) yet charged"


@pytest.mark.parametrize("perturb", ["model", "update"])
def test_a_float64_model_that_overflows_float32_is_refused_before_the_charge(app, tmp_path, perturb):
    """check_instruction refuses a non-finite model, but tests finiteness of the arrays as received: float64
    1e300 is finite there and becomes inf once loaded into the float32 model. The rule then trains an inf/NaN
    model and output perturbation fails to clip it, after the charge."""
    context = node(tmp_path, privacy="output", **{"output-perturb": perturb})
    state = local_client(context).model.state_dict()
    huge = ArrayRecord(OrderedDict((k, torch.full(v.shape, 1e300, dtype=torch.float64)) for k, v in state.items()))
    reply = send(app, context, instruction(context, arrays=huge))
    if not reply.has_error():
        assert all(np.isfinite(a.numpy()).all() for a in reply.content[ARRAYS].values())
        return
    assert entries(context) == [], f"refused ({reply.error.reason.splitlines()[0]}) yet charged"


def test_fedlap_dp_refuses_a_non_numeric_learning_rate_before_the_charge(app, tmp_path):
    """client/updates/fedlap.py fedlap_update charges, then parses the server's fedlap-lr (float('abc'))."""
    context = node(tmp_path, **FEDLAP_DP)
    reply = send(app, context, instruction(context, **{"fedlap-lr": "abc"}))
    assert reply.has_error()
    assert entries(context) == [], "a refused instruction was charged to the ledger"


def test_a_resumable_fedlap_dp_node_refuses_an_instruction_without_lineage_before_training(app, tmp_path):
    """client/resume.py resumable validates the lineage token only in restore (skipped once Context.state holds
    FedLAP's carried-over set) and in save, i.e. after the rule charged and trained: the node replies with an
    error ('lineage' must be a hex token, got '') and its ledger holds the round's dpsgd + post-processing
    entries for a release that never happened."""
    context = node(tmp_path, **FEDLAP_DP, checkpoint=True, **{"run-name": "r"})
    first = send(app, context, instruction(context, lineage="aa"))
    assert not first.has_error(), first.error.reason
    before = entries(context)
    reply = send(app, context, instruction(context, **{"server-round": 2}))  # no lineage
    assert reply.has_error()
    assert entries(context) == before, "a refused instruction was charged to the ledger"
