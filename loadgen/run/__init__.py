"""Running a replay: flags to a plan, levels driven by a runner on one or more workers (closed or
open loop), each request timed and accounted, and each level's summary for the results file.
replay.py is the top: one `loadgen replay` (or `bench`, `capacity`) run from its flags."""
