"""Adversarial, threat 6: an endless loop in Python. Must time out."""


def custom_kernel(data):
    while True:
        pass
