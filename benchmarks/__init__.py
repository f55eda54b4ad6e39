"""Speed and memory benchmarks: kernels, train steps, compiled memory; each script writes JSON."""
