"""Where an engine step's host time goes, from a native py-spy profile (scripts/profile_steps.py).

    py-spy record --native --rate 25 --format raw -o stacks.txt -- python scripts/profile_steps.py ...
    python scripts/read_stacks.py stacks.txt

Only samples inside `MlxEngine.step` count. Each is filed under the innermost Python function on its
stack and the MLX primitive being encoded (`mlx::core::X::eval_gpu`), with what that primitive was
doing at the time (NVRTC compiling a kernel, cuBLASLt, cuDNN building a plan, CUDA graph upkeep), so
"launch" time reads as the primitives and library calls behind it. Keep the rate low (25 Hz): native
unwinding pauses a CUDA process long enough to fall behind at 200 Hz.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

# what a native frame says the host was doing, first match wins
ACTIVITIES = (
    ("nvrtc", "NVRTC compiling a kernel"),
    ("cudnn_frontend::graph::Graph::build_plans", "cuDNN building a plan"),
    ("cublasLt", "cuBLASLt"),
    ("CaptureContext", "cuBLAS stream capture"),
    ("cudaGraphExecUpdate", "CUDA graph update"),
    ("cudaGraphInstantiate", "CUDA graph instantiate"),
    ("cudaGraphLaunch", "CUDA graph launch"),
    ("cudaGraph", "CUDA graph upkeep"),
    ("malloc", "allocation"),
)
_PRIMITIVE = re.compile(r"mlx::core::(?:\w+::)*(\w+)::eval_gpu")


def _name(frame: str) -> str:
    return re.sub(r" \(.*\)$", "", frame)


def file_sample(stack: list[str]) -> tuple[str, str, str]:
    """(innermost Python function, MLX primitive being encoded or "", activity or "")."""
    python = [_name(f) for f in stack if ".py:" in f]
    primitive = ""
    for frame in stack:
        if match := _PRIMITIVE.search(frame):
            primitive = match.group(1)
    activity = next((label for key, label in ACTIVITIES if any(key in f for f in stack)), "")
    return (python[-1] if python else "", primitive, activity)


def read(path: Path, inside: str = "MlxEngine.step") -> tuple[int, Counter]:
    total, filed = 0, Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if inside not in stack:
            continue
        total += int(count)
        filed[file_sample(stack.split(";"))] += int(count)
    return total, filed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("stacks", type=Path, help="py-spy --format raw output")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    total, filed = read(args.stacks)
    print(f"{total} samples inside MlxEngine.step")
    activities: Counter = Counter()
    for (_, _, activity), count in filed.items():
        activities[activity or "(other)"] += count
    print("by activity:")
    for activity, count in activities.most_common():
        print(f"  {100 * count / total:5.1f} %  {activity}")
    print("by Python function / primitive / activity:")
    for (function, primitive, activity), count in filed.most_common(args.top):
        print(f"  {100 * count / total:5.1f} %  {function} / {primitive or '-'} / {activity or '-'}")


if __name__ == "__main__":
    main()
