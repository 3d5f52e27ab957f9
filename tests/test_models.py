import pytest
import torch

from common.config import ConfigError, validate
from common.models import build_model, num_parameters


@pytest.mark.parametrize("name,shape,classes,expected", [
    ("ali-mnist-cnn", (1, 28, 28), 10, 26_010),
    ("ali-cifar-cnn", (3, 32, 32), 10, 550_570),
    ("fedavg-cnn", (1, 28, 28), 10, 582_026),
    ("fedavg-cnn", (3, 32, 32), 10, 878_538),
    ("convnet", (1, 28, 28), 10, 317_706),
    ("convnet", (3, 32, 32), 10, 320_010),
    ("femnist-mlp", (1, 28, 28), 10, 155_830),
    ("logreg", (20,), 2, 42),
    ("logreg-softmax", (20,), 2, 42),
    ("adult-mlp", (104,), 2, 104 * 64 + 64 + 64 * 32 + 32 + 32 * 2 + 2),
])
def test_parameter_counts_and_forward(name, shape, classes, expected):
    model = build_model(name, shape, classes)
    assert num_parameters(model) == expected
    assert model(torch.zeros(3, *shape)).shape == (3, classes)


def test_image_model_refuses_wrong_input():
    with pytest.raises(ValueError, match="28x28"):
        build_model("ali-mnist-cnn", (3, 32, 32), 10)
    with pytest.raises(ValueError, match="16x16"):
        build_model("fedavg-cnn", (1, 8, 8), 10)
    with pytest.raises(ValueError, match="unknown model"):
        build_model("resnet", (3, 32, 32), 10)


def test_logreg_softmax_is_logreg_then_softmax():
    torch.manual_seed(0)
    plain, softmax = build_model("logreg", (20,), 2), build_model("logreg-softmax", (20,), 2)
    softmax.load_state_dict(plain.state_dict())
    x = torch.randn(5, 20)
    assert torch.allclose(softmax(x), torch.softmax(plain(x), dim=1))


# --- an adversarial review, session 21: each case failed on the code it reviewed
@pytest.mark.parametrize("dataset,model", [
    ("synthetic", "convnet"),        # 60-d vectors into an image model
    ("adult", "ali-mnist-cnn"),      # 104-d vectors into an image model
    ("mnist", "ali-cifar-cnn"),      # 28x28 images into Table VI's 32x32 CNN
    ("cifar10", "ali-mnist-cnn"),    # 32x32 images into Table V's 28x28 CNN
])
def test_model_dataset_mismatch_is_a_config_error(dataset, model):
    """`validate` accepts a model that cannot take the dataset's inputs. The mismatch surfaces only when
    the nodes build the model at enrollment, as a plain ValueError: in-process as "FederationError:
    enrollment failed: node ...: <class 'ValueError'>", under `--engine simulation` as a Ray
    ClientAppException traceback and "flwr run failed: the ServerApp ended without results" (after ~30 s),
    never as the one-line ConfigError every other bad combination gets before anything starts."""
    with pytest.raises(ConfigError, match=model):
        validate({"dataset": dataset, "model": model})
