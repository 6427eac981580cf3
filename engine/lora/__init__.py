"""LoRA adapters served beside the base model: read from PEFT folders (adapter.py), held in
a bounded number of slots per layer (weights.py) and made resident per step (manager.py)."""
