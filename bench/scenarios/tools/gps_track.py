#!/usr/bin/env python3
"""Prints a seeded, generated GPS track as source document 001's recorded tracks are:
CSV with the header `lat,long`, no time column, 10 decimals, starting at the document's first
point (Aarhus). A runner at ~3 m/s sampled each second, turning slowly, with GPS jitter.

    bench/scenarios/tools/gps_track.py --points 300 --seed 1

The generator is a 64-bit LCG (not Python's `random`), so the output is the same on every
Python version. trajectory-http-document.yaml embeds its output for --points 300 --seed 1.
"""
import argparse
import math


class Lcg:
    def __init__(self, seed: int) -> None:
        self.state = (seed * 6364136223846793005 + 1442695040888963407) % 2**64

    def uniform(self) -> float:
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) % 2**64
        return (self.state >> 11) / float(1 << 53)


def track(points: int, seed: int) -> str:
    rng = Lcg(seed)
    lat, lon = 56.2568605075, 10.0688809242
    heading = rng.uniform() * 2 * math.pi
    rows = ["lat,long"]
    for _ in range(points):
        jitter_lat = (rng.uniform() - 0.5) * 0.00002
        jitter_lon = (rng.uniform() - 0.5) * 0.00003
        rows.append(f"{lat + jitter_lat:.10f},{lon + jitter_lon:.10f}")
        heading += (rng.uniform() - 0.5) * 0.3
        step = 3.0 + (rng.uniform() - 0.5)  # metres
        lat += step * math.cos(heading) / 111_320
        lon += step * math.sin(heading) / (111_320 * math.cos(math.radians(lat)))
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(track(args.points, args.seed), end="")
