"""Adversarial, threat 6: sleeps for ten days. Must time out."""
import time


def custom_kernel(data):
    time.sleep(864_000)
