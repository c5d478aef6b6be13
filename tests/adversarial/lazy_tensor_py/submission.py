"""Adversarial, issue 10 (lazy output): returns a tensor subclass that computes only when it is
first used, hoping to be used after the clock stops. The harness's clock runs until O is in its
own buffer, so the work is timed: must pass, at the honest twin's time."""
import torch

from honest_flash import custom_kernel as honest


class Lazy(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        for a in args:
            if isinstance(a, Lazy) and getattr(a, "_inputs", None) is not None:
                inputs, a._inputs = a._inputs, None
                with torch._C.DisableTorchFunctionSubclass():
                    a.copy_(honest(inputs))
        return super().__torch_function__(func, types, args, kwargs or {})


def custom_kernel(data):
    out = torch.empty_like(data[0]).as_subclass(Lazy)
    out._inputs = tuple(data)
    return out
