import os

# Tests run on the CPU; multi-device tests start their own processes.
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
