"""The wire protocol (``clockwork.v1``): the .proto and its generated modules."""
