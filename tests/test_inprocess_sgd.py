"""The hand-written SGD step in client/updates/sgd.py performs exactly
torch.optim.SGD's operations: same weights and loss, bit for bit."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from client.updates.sgd import minibatches, train_sgd


def reference_train_sgd(model, x, y, *, epochs, batch_size, lr, momentum, generator):
    """The textbook loop with torch.optim.SGD (what train_sgd replaces)."""
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    total, batches = 0.0, 0
    for _ in range(epochs):
        for idx in minibatches(len(y), batch_size, generator):
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
            total += loss.item()
            batches += 1
    return total / max(batches, 1)


MODELS = {
    "logreg": lambda: nn.Sequential(nn.Flatten(), nn.Linear(20, 10)),  # kernels by hand: batch_gradient.py
    "logreg-softmax": lambda: nn.Sequential(nn.Flatten(), nn.Linear(20, 10), nn.Softmax(dim=1)),
    "mlp": lambda: nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 10)),
}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_train_sgd_matches_torch_optim_sgd(name, momentum):
    x, y = torch.randn(150, 20), torch.randint(0, 10, (150,))
    torch.manual_seed(0)
    ours = MODELS[name]()
    torch.manual_seed(0)
    ref = MODELS[name]()
    kw = dict(epochs=3, batch_size=32, lr=0.1, momentum=momentum)
    loss_ours = train_sgd(ours, x, y, generator=torch.Generator().manual_seed(7), **kw)
    loss_ref = reference_train_sgd(ref, x, y, generator=torch.Generator().manual_seed(7), **kw)
    assert loss_ours == loss_ref
    for (k, a), (_, b) in zip(ours.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), k


def test_frozen_parameters_stay_put():
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    model[0].weight.requires_grad_(False)
    before = model[0].weight.clone()
    x, y = torch.randn(10, 4), torch.randint(0, 2, (10,))
    train_sgd(model, x, y, epochs=1, batch_size=4, lr=0.1, momentum=0.9, generator=torch.Generator().manual_seed(0))
    assert torch.equal(model[0].weight, before)


class PartlyUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.unused = nn.Linear(20, 10), nn.Linear(3, 3)

    def forward(self, x):
        return self.used(x)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_unused_parameters_match_torch_optim(momentum):
    x, y = torch.randn(70, 20), torch.randint(0, 10, (70,))
    torch.manual_seed(0)
    ours = PartlyUnused()
    torch.manual_seed(0)
    ref = PartlyUnused()
    kw = dict(epochs=2, batch_size=16, lr=0.05, momentum=momentum)
    assert train_sgd(ours, x, y, generator=torch.Generator().manual_seed(3), **kw) == \
        reference_train_sgd(ref, x, y, generator=torch.Generator().manual_seed(3), **kw)
    for (k, a), (_, b) in zip(ours.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), k
