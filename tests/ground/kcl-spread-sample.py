#!/usr/bin/env python3
"""The unmodified amazon_kclpy sample with a fixed cost per record on a CPU shared by one consumer's
children: what `kcl-bench.py --spread` runs (kcl-sample.sh picks it when KCL_BENCH_RECORD_COST_MS is set),
under the Java KCL and under leasehold-worker alike.

Every record takes KCL_BENCH_RECORD_COST_MS of the consumer's CPU, modelled by the file
KCL_BENCH_CPU_FILE (one per consumer): it holds when that CPU is next free, read and advanced under an
flock, and the child sleeps until its slot has passed before the sample logs the record. So a consumer
processes at most 1000 / KCL_BENCH_RECORD_COST_MS records/s over all its shards, in the order they asked,
whatever shards it holds (the schedule of worker/benches/spread.rs: holding the lock through a 5 ms sleep
would add the timer's slack to every record, and flock is not first come, first served). The child also
writes `KCL_BENCH_SHARD <shardId>` to its stderr file when it starts, so the records in that file can be
told apart by shard.
"""
import fcntl, os, struct, sys, time

sys.path.insert(0, os.path.join(os.environ["KCLPY"], "samples"))
import sample_kclpy_app  # noqa: E402
from amazon_kclpy import kcl  # noqa: E402

COST = float(os.environ["KCL_BENCH_RECORD_COST_MS"]) / 1000


class CostlyRecordProcessor(sample_kclpy_app.RecordProcessor):
    def __init__(self):
        super().__init__()
        self._cpu = os.open(os.environ["KCL_BENCH_CPU_FILE"], os.O_RDWR | os.O_CREAT, 0o644)

    def initialize(self, initialize_input):
        self.log(f"\nKCL_BENCH_SHARD {initialize_input.shard_id}\n")
        super().initialize(initialize_input)

    def process_record(self, data, partition_key, sequence_number, sub_sequence_number):
        # CLOCK_MONOTONIC is one clock for every process of the machine.
        fcntl.flock(self._cpu, fcntl.LOCK_EX)
        try:
            raw = os.pread(self._cpu, 8, 0)
            done = max(struct.unpack("d", raw)[0] if len(raw) == 8 else 0.0, time.monotonic()) + COST
            os.pwrite(self._cpu, struct.pack("d", done), 0)
        finally:
            fcntl.flock(self._cpu, fcntl.LOCK_UN)
        time.sleep(max(0.0, done - time.monotonic()))
        super().process_record(data, partition_key, sequence_number, sub_sequence_number)


if __name__ == "__main__":
    kcl.KCLProcess(CostlyRecordProcessor()).run()
