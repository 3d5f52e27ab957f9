"""FedLAP-DP pure math (Wang et al., PoPETS 2024): no Flower, no config.

- `matching.py`: the gradient-matching distance L_dis (Eq. 10-11).
- `augment.py`: DSA-style differentiable augmentation, one seeded op per call.
- `trust.py`: trust-region pieces (parameter distance, cosine learning rate,
  radius voting, radius calibration).
"""
