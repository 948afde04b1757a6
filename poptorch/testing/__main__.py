"""``python -m poptorch.testing`` prints the path to give ``TORCH_TEST_DEVICES``."""
from . import DEVICE_TEST_BASE

print(DEVICE_TEST_BASE)
