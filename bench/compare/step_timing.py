"""Step timing shared by the PyTorch sides of bench/compare (torch_head.py, torch_moe.py)."""
import time


def median_step_seconds(step, warmup, steps):
    """Runs step() `warmup` times untimed, then `steps` times; returns the median wall time of the
    timed calls in seconds (the mean of the two middle ones for an even count)."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    n = len(times)
    return times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])
