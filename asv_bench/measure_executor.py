"""One-shot measurement of the executor benchmark (medians), outside asv.

Run from the repository root: python asv_bench/measure_executor.py [--quick]
Prints, per backend, L and draft count, the median time of tokcy's prepare_inputs (with
a preallocated out) and of the baselines, and the ratios the issue sets goals for.
"""

import statistics
import sys
import time

sys.path[:0] = [".", "asv_bench/benchmarks"]

import bench_executor  # noqa: E402


def median_seconds(function, repeats):
    function()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main():
    quick = "--quick" in sys.argv
    results = {}
    for backend in ("cython", "python"):
        for num_drafts in (0, 3):
            for seq_len in (2048, 32768, 131072):
                bench = bench_executor.PrepareInputs()
                bench.setup(backend, seq_len, num_drafts)
                args = (backend, seq_len, num_drafts)
                row = {
                    "tokcy": median_seconds(lambda: bench.time_tokcy(*args), 50 if quick else 300),
                    "after": median_seconds(lambda: bench.time_after(*args), 10 if quick else 50),
                    "numpy": median_seconds(lambda: bench.time_numpy(*args), 10 if quick else 50),
                    "before": median_seconds(lambda: bench.time_before(*args), 3),
                }
                bench.teardown(*args)
                results[args] = row
                print(f"{backend:6s} L={seq_len:6d} k={num_drafts}  " + "  ".join(
                    f"{name} {seconds * 1e6:9.1f} us" for name, seconds in row.items()) +
                    f"  | after/tokcy {row['after'] / row['tokcy']:6.1f}x  numpy/tokcy {row['numpy'] / row['tokcy']:5.1f}x"
                    f"  before/tokcy {row['before'] / row['tokcy']:7.0f}x", flush=True)
                del bench
    for backend in ("cython", "python"):
        for num_drafts in (0, 3):
            flat = results[(backend, 131072, num_drafts)]["tokcy"] / results[(backend, 2048, num_drafts)]["tokcy"]
            print(f"{backend} k={num_drafts}: tokcy L=131072 / L=2048 = {flat:.2f}x")


if __name__ == "__main__":
    main()
