"""Engine tests share the session fixtures of tests/conftest.py (`tiny_model_dir`)."""

import torch

torch.set_num_threads(min(2, torch.get_num_threads()))
