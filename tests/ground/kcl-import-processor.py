#!/usr/bin/env python3
"""The KCL side of tests/ground/kcl-import.py: an amazon_kclpy record processor run by the real Java
MultiLangDaemon. It logs every user record it processes ("<shard> <sequence> <sub> <data>") and every
checkpoint it makes ("CHECKPOINT <shard> <sequence> <sub>") to $KCL_IMPORT_LOG, waits
$KCL_IMPORT_DELAY seconds per record, checkpoints every 7th record, and on the first shard it sees an
aggregate on checkpoints at that aggregate's user record 1 and never again, so the table ends with a
checkpoint inside a KPL aggregate followed by an uncheckpointed tail. It never checkpoints on shutdown.
"""
import os
import time

from amazon_kclpy import kcl
from amazon_kclpy.v3 import processor

LOG = os.environ["KCL_IMPORT_LOG"]
DELAY = float(os.environ.get("KCL_IMPORT_DELAY", "0.03"))


class Recorder(processor.RecordProcessorBase):
    def __init__(self):
        self.shard = None
        self.count = 0
        self.frozen = False

    def initialize(self, initialize_input):
        self.shard = initialize_input.shard_id

    def process_records(self, process_records_input):
        with open(LOG, "a") as out:
            for record in process_records_input.records:
                seq, sub = record.sequence_number, record.sub_sequence_number or 0
                out.write(f"{self.shard} {seq} {sub} {record.binary_data.decode()}\n")
                out.flush()
                self.count += 1
                inside = record.binary_data.decode().startswith("agg-") and sub == 1
                if self.shard.endswith("0") and inside and not self.frozen:
                    process_records_input.checkpointer.checkpoint(seq, sub)
                    out.write(f"CHECKPOINT {self.shard} {seq} {sub}\n")
                    self.frozen = True
                elif self.count % 7 == 0 and not self.frozen:
                    process_records_input.checkpointer.checkpoint(seq, sub)
                    out.write(f"CHECKPOINT {self.shard} {seq} {sub}\n")
                out.flush()
                time.sleep(DELAY)

    def lease_lost(self, lease_lost_input):
        pass

    def shard_ended(self, shard_ended_input):
        shard_ended_input.checkpointer.checkpoint()

    def shutdown_requested(self, shutdown_requested_input):
        pass


if __name__ == "__main__":
    kcl.KCLProcess(Recorder()).run()
