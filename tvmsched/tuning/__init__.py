"""Intra-operator tuning: MetaSchedule logs per target (`log`) and the `tune` driver."""

from tvmsched.tuning.log import TuningLog, applied, build_logs, database_key, shipped_root, user_root
from tvmsched.tuning.tune import TuneOptions, TuneResult, tune

__all__ = ["TuneOptions", "TuneResult", "TuningLog", "applied", "build_logs", "database_key", "shipped_root",
           "tune", "user_root"]
