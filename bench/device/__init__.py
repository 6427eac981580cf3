"""The device check (`make gpu-check`, `python -m bench.device.check`): every GPU figure the
docs cite, made in one prepared run on the device; check.py says what it measures."""
