"""Adversarial, threat 6: prints 40 MB on the first call of each shape, then computes honestly.
Must pass, with its output capped (head and tail kept) in the log."""
from honest_flash import custom_kernel as honest

LINE = "spam " * 200
seen = set()


def custom_kernel(data):
    if data[0].shape not in seen:
        seen.add(data[0].shape)
        for _ in range(40_000_000 // (len(LINE) + 1)):
            print(LINE)
    return honest(data)
