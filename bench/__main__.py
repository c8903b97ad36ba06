"""python3 -m bench [options]: the bench (bench/bench.py); --help lists its options."""
from bench import bench

if __name__ == "__main__":
    bench.main()
