"""A/B comparison of runs, level by level: stats.py measures (metric values, session bootstrap),
verdicts.py decides (paired t over rounds on matched requests, Welch t over repeats, run-to-run
noise; the tests themselves in significance.py), render.py prints (table, JSON). What it compares
are the registry's statistics (loadgen/results/metric_registry.py). The names below are the
package's public interface."""

from loadgen.compare.render import format_comparison, to_json
from loadgen.compare.significance import (
    CONFIDENCE,
    benjamini_hochberg,
    block_log_test,
    pooled_log_test,
    welch_log_test,
)
from loadgen.compare.stats import (
    CompareError,
    LevelSample,
    RankedWeights,
    cluster_counts,
    level_sample,
    play_keys,
    point_values,
    session_bootstrap,
)
from loadgen.compare.verdicts import (
    Comparison,
    Gate,
    LevelComparison,
    MetricResult,
    RunNoise,
    compare_runs,
    load_run_noise,
    regressions,
    verdict,
)

__all__ = [
    "CONFIDENCE", "CompareError", "Comparison", "Gate",
    "LevelComparison", "LevelSample", "MetricResult", "RankedWeights", "RunNoise",
    "benjamini_hochberg", "block_log_test", "cluster_counts", "compare_runs", "format_comparison", "level_sample",
    "load_run_noise", "play_keys", "point_values", "pooled_log_test", "regressions", "session_bootstrap",
    "to_json", "verdict", "welch_log_test",
]
