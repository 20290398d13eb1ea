"""The exceptions tvmsched raises: one family per kind of problem, each message naming the fix.

The CLI turns every `TvmschedError` into one red line and exit code 2.
"""


class TvmschedError(Exception):
    """Base class of every error tvmsched reports to a user."""


class ModelLoadError(TvmschedError):
    """The model file is missing, unreadable, or not a valid ONNX model."""


class UnsupportedOperator(TvmschedError):
    """The model uses an operator (or opset) the TVM Relax ONNX frontend cannot import."""


class ShapeBindingError(TvmschedError):
    """An input shape is dynamic and not bound, or a requested binding does not fit the model."""


class ConstantInputRequired(ShapeBindingError):
    """A graph input's value decides a shape (or an axis), so it must be bound when the model is built."""

    def __init__(self, message: str, inputs: tuple[str, ...]):
        super().__init__(message)
        self.inputs = inputs


class InputError(TvmschedError):
    """Inputs given to a compiled model do not match its input names, shapes or dtypes."""


class GraphError(TvmschedError):
    """The lowered program contains something the kernel graph or executor cannot represent."""


class TargetError(TvmschedError):
    """The target is unknown, or no device for it is present."""


class UnknownModel(TvmschedError, KeyError):
    """A zoo model name that does not exist (also a KeyError, as a failed lookup)."""

    def __str__(self) -> str:
        return str(self.args[0])


class ArtifactError(TvmschedError):
    """A saved build (library, plan, metadata) is missing, corrupt, or made for something else."""


class UsageError(TvmschedError):
    """A command's flags contradict each other or what they are applied to (e.g. a compile flag given
    with a saved build)."""


def check_choice(what: str, value: str, choices: tuple[str, ...]) -> None:
    """Refuse a `value` of option `what` that is none of `choices`."""
    if value not in choices:
        raise UsageError(f"unknown {what} '{value}'; choose one of {', '.join(choices)}")


class OutputError(TvmschedError):
    """A file or directory tvmsched was asked to write cannot be written there."""


class TuningLogError(TvmschedError):
    """A tuning log is corrupt, made for another target, or being written by another tuning run."""
