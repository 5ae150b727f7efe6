"""The fulfilment service's protobuf schema, compiled at run time (no generated code checked in).

``descriptor_set()`` compiles ``protos/events.proto`` with grpc_tools into a FileDescriptorSet
(the file ``dlx_protobuf_descriptor_sets`` names, so ``celery dlx show`` decodes the events);
``message_class()`` builds a message class from it, for the publisher of the events.
"""

from __future__ import annotations

import os
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

PROTO_DIR = Path(__file__).resolve().parent / "protos"
PROTO_FILE = "events.proto"
#: Where the compiled descriptor set goes (git ignores it).
DESCRIPTOR_SET = PROTO_DIR / "events.pb"
#: The event type the orders service publishes to fulfilment.
ORDER_PLACED = "shop.fulfilment.v1.OrderPlaced"


def descriptor_set(path: Path = DESCRIPTOR_SET) -> Path:
    """Compile ``events.proto`` into ``path`` unless it is there and newer than the proto.

    Written to a temporary file first and renamed, so processes starting together never read
    half a file.

    Raises:
        RuntimeError: protoc failed (its message is on stderr).
    """
    source = PROTO_DIR / PROTO_FILE
    if path.exists() and path.stat().st_mtime >= source.stat().st_mtime:
        return path
    from grpc_tools import protoc

    include = str(resources.files("grpc_tools") / "_proto")
    fd, tmp = tempfile.mkstemp(prefix=".events-", suffix=".pb", dir=path.parent)
    os.close(fd)
    try:
        argv = [
            "protoc",
            f"-I{PROTO_DIR}",
            f"-I{include}",
            f"--descriptor_set_out={tmp}",
            "--include_imports",
            PROTO_FILE,
        ]
        if protoc.main(argv) != 0:
            raise RuntimeError(f"protoc could not compile {source}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def message_class(name: str = ORDER_PLACED) -> Any:
    """The message class of type ``name``, built from the compiled descriptor set."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set().read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file_proto in files.file:
        pool.Add(file_proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
