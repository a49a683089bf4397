"""`python -m benchmarks NAME`: run one benchmark (spine, text, suite, overlap, ratio, loader,
ingest, object_storage, control_plane, journal_store, dct_scale, restart_index, corrupt_jpegs, data_parallel,
transform_contract, transform_example, stability, plan_check, foreign, photos, fleet, fleet_scale, fleet_price,
tokenize_cost, text_peers)
or all of them.

`gpu_check` is not among them: it needs a CUDA GPU (`python -m benchmarks.gpu_check`). `soak` runs
alone, never in `all` (about 20 minutes here): `python -m benchmarks soak [RUNS]` or `make soak`; so
does `repeat` (the tests behind the process and kill guarantees, RUNS times each, about 15 minutes), and
`repeat_fleet` (the fleet's, about 20 minutes) and `repeat_hangs` (a hanging transform and a host out of
processes, at the default timeouts: about 16 minutes), and `repeat_trainers` (Lightning and Accelerate
end to end, a kill and a resume from each one's checkpoint: about 20 minutes), and `text_elastic` (text jobs
resumed at other world sizes and under torchrun's elastic mode, RUNS times each: about 35 minutes)."""

import os
import sys

from benchmarks import (
    control_plane,
    corrupt_jpegs,
    data_parallel,
    dct_scale,
    fleet,
    fleet_price,
    fleet_scale,
    foreign,
    ingest,
    journal_store,
    loader,
    object_storage,
    overlap,
    plan_check,
    ratio,
    repeat,
    restart_index,
    soak,
    spine,
    stability,
    suite,
    text,
    text_elastic,
    text_peers,
    tokenize_cost,
    transform_contract,
    transform_example,
)

BENCHMARKS = {"spine": spine.main, "text": text.main, "suite": suite.main, "overlap": overlap.main,
              "ratio": ratio.main, "loader": loader.main, "ingest": ingest.main, "object_storage": object_storage.main,
              "control_plane": control_plane.main, "journal_store": journal_store.main,
              "dct_scale": dct_scale.main, "restart_index": restart_index.main, "corrupt_jpegs": corrupt_jpegs.main,
              "data_parallel": data_parallel.main, "transform_contract": transform_contract.main,
              "transform_example": transform_example.main, "stability": stability.main,
              "plan_check": plan_check.main, "foreign": foreign.main,
              "photos": lambda rounds=3: foreign.main(rounds, "photos"), "fleet": fleet.main,
              "fleet_scale": fleet_scale.main,
              "fleet_price": fleet_price.main,
              "tokenize_cost": tokenize_cost.main, "text_peers": text_peers.main}

ALONE = {"soak": soak.main, "repeat": repeat.main,  # never part of `all`
         "repeat_fleet": lambda runs=10: repeat.main(runs, "repeat_fleet"),
         "repeat_hangs": lambda runs=10: repeat.main(runs, "repeat_hangs"),
         "repeat_trainers": lambda runs=10: repeat.main(runs, "repeat_trainers"),
         "repeat_commits": lambda runs=10: repeat.main(runs, "repeat_commits"),
         "text_elastic": text_elastic.main}

if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else "all"
    counts = [int(a) for a in sys.argv[2:]]  # `soak RUNS`, `stability REPEATS`, `plan_check REPEATS`, `foreign ROUNDS`
    if name in ALONE:
        raise SystemExit(ALONE[name](*counts))
    if name != "all" and name not in BENCHMARKS:
        raise SystemExit(f"unknown benchmark {name!r}; choose from {', '.join([*BENCHMARKS, *ALONE])} or all")
    for chosen in BENCHMARKS if name == "all" else [name]:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))  # each benchmark pins itself
        BENCHMARKS[chosen](*(counts if name != "all" else []))
