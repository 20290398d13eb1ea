"""Intra-operator tuning: MetaSchedule logs per target (`log`) and the `tune` driver."""

from tvmsched.tuning.log import TuningLog, default_root
from tvmsched.tuning.tune import TuneOptions, TuneResult, tune

__all__ = ["TuneOptions", "TuneResult", "TuningLog", "default_root", "tune"]
