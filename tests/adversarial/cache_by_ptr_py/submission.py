"""Adversarial, threat 2: caches its output keyed by the inputs' addresses and shape. Each case
is called once, so the checked calls are right; the timed calls get fresh inputs, often at the
same addresses, and get a stale output. Must be flagged on a GPU (timed outputs are checked)."""
from honest_flash import custom_kernel as honest

cache = {}


def custom_kernel(data):
    q, k, v = data
    key = (q.data_ptr(), k.data_ptr(), v.data_ptr(), tuple(q.shape))
    if key not in cache:
        cache[key] = honest(data)
    return cache[key]
