"""``specframe bench``: run schedules side by side on a task with the paper's protocol.

The pieces, one job each:

* :mod:`~specframe.bench.tasks`: prompt sets with the paper's zero-shot prompts and graders;
* :mod:`~specframe.bench.grading`: answer extraction/normalisation and the code sandbox;
* :mod:`~specframe.bench.runner`: interleaved, resumable, shardable generation writing ``records.jsonl``;
* :mod:`~specframe.bench.closed_loop`: a closed-loop run of N requests in flight (``--concurrency``), timed
  per request as its user sees it (time to first token, inter-token latency);
* :mod:`~specframe.bench.stats` and :mod:`~specframe.bench.summary`: aggregate statistics and the paired
  percentile bootstrap over prompts;
* :mod:`~specframe.bench.report` and :mod:`~specframe.bench.plots`: the terminal table and the figures;
* :mod:`~specframe.bench.merge`: combining shards.

From Python::

    from specframe.bench import BenchSettings, run_bench

    settings = BenchSettings(task="smoke", schedules=["ar", "linear", "packed"], widths=[8])
    summary, report = run_bench(settings, "runs/smoke")
"""

from specframe.bench.merge import merge_runs
from specframe.bench.runner import run_bench
from specframe.bench.settings import BenchSettings, Method
from specframe.bench.stats import Estimate, PairedBootstrap, bootstrap_sums
from specframe.bench.summary import summarize
from specframe.bench.tasks import get_task

__all__ = [
    "BenchSettings",
    "Estimate",
    "Method",
    "PairedBootstrap",
    "bootstrap_sums",
    "get_task",
    "merge_runs",
    "run_bench",
    "summarize",
]
