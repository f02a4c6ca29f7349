"""What the real devices (cpu, cuda) share."""

from __future__ import annotations


class DeviceError(RuntimeError):
    """A model is unknown, not loaded, or called with a bad batch/input."""


class RealDevice:
    """Instance lookup, and the executor's view of a real device: its actions' durations
    are measured when they run, not predicted (``duration`` is None: see
    ``worker.executor``). Subclasses keep ``self.models``: instance name -> state with
    ``pages`` (None when not loaded)."""

    models: dict

    def duration(self, action, profile) -> None:
        return None

    def _model(self, name: str):
        try:
            return self.models[name]
        except KeyError:
            raise DeviceError(f"unknown model {name!r}") from None

    def loaded(self, name: str) -> bool:
        return self._model(name).pages is not None
