__version__ = "0.1.0"


def __getattr__(name: str):
    # lazy: ``import clockwork`` stays light (no grpc) for the simulator
    if name in ("Client", "AsyncClient"):
        from clockwork import client

        return getattr(client, name)
    if name == "errors":
        import clockwork.errors as errors

        return errors
    raise AttributeError(f"module 'clockwork' has no attribute {name!r}")
